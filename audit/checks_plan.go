package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// planHops is plan.hops.
var planHops = Check{
	ID: "plan.hops", Title: "the plan to upstream's newest release", Severity: Info, Runs: InAudit,
	Meaning: "apply takes a database from its release to upstream's newest (" + versions.Newest + ") by hops: this tool's own migration for " +
		"0.16.0 -> 0.17.0, upstream's own files (from your copy, --pgflow-migrations) for the others, all in one guarded transaction. " +
		"Each hop is listed with what it does, followed by the findings of that hop's own checks (the hops.* checks: what makes its file fail, " +
		"or what it changes for your workers), which apply runs again under its locks right before the hop.",
	Remedy: "Keep pgflow's migration files at hand (npx pgflow install puts them in supabase/migrations) and pass the folder to apply " +
		"with --pgflow-migrations; decide on telemetry (apply --telemetry off opts out); apply --to 0.17.0 stops after this tool's own hop.",
	Run: checkPlanHops,
}

func checkPlanHops(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	d := env.Schema.Version
	if d == nil || d.Release == nil {
		return nil, nil
	}
	r := d.Release
	all := versions.UpstreamFiles()
	if r.AtNewest() {
		return []Finding{c.finding(0, "pgflow "+r.Name+" is upstream's newest release: no hop to take", nil)}, nil
	}
	var samples []map[string]any
	for i := r.Files + 1; i <= len(all); i++ {
		kind := "upstream's file, from your copy"
		if i == 24 {
			kind = "this tool's migration (queue persistence), in place of upstream's file"
		}
		samples = append(samples, map[string]any{"hop": versions.StateName(i-1) + " -> " + versions.StateName(i),
			"file": all[i-1].Name, "runs": kind, "does": strings.Join(versions.FileNotes(i), "; ")})
	}
	out := []Finding{c.finding(int64(len(samples)), fmt.Sprintf("%d hops from %s to %s (listed)", len(samples), r.Name, versions.Newest), samples)}
	// Each hop's own checks, in the order of the hops.
	for i := r.Files + 1; i <= len(all); i++ {
		for _, hc := range declared(hopChecks, InAudit, HopFile(i)) {
			if unmet(hc.Needs, env) != "" {
				continue
			}
			fs, err := hc.Run(ctx, hc, q, env)
			if err != nil {
				return nil, fmt.Errorf("%s (hop to upstream's file %d): %w", hc.ID, i, err)
			}
			out = append(out, fs...)
		}
	}
	return out, nil
}
