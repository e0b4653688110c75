package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// planHops is plan.hops.
var planHops = Check{
	ID: "plan.hops", Title: "the plan to upstream's newest release", Severity: Info,
	Meaning: "apply takes a database from its release to upstream's newest (" + versions.Newest + ") by hops: this tool's own migration for " +
		"0.16.0 -> 0.17.0, upstream's own files (from your copy, --pgflow-migrations) for the others, all in one guarded transaction. " +
		"Each hop is listed with what it does and what it can fail on: rows 0.15.1's valid_status CHECK rejects (counted here), " +
		"0.17.1's need for pg_cron's cron.schedule, and the daily telemetry job 0.17.1 schedules.",
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
	if r.Files < 22 {
		var bad int64
		if err := q.QueryRow(ctx, `select count(*) from pgflow.step_tasks
			where status <> all (array['queued', 'started', 'completed', 'failed', 'skipped', 'cancelled'])`).Scan(&bad); err != nil {
			return nil, fmt.Errorf("counting step_tasks 0.15.1's valid_status rejects: %w", err)
		}
		out = append(out, c.finding(bad, fmt.Sprintf("hop to 0.15.1: %d step_tasks rows have a status its valid_status CHECK rejects (apply refuses while any does)", bad), nil))
	}
	if r.Files < 26 {
		var cron bool
		if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
			where n.nspname = 'cron' and p.proname = 'schedule' and p.pronargs = 3)`).Scan(&cron); err != nil {
			return nil, fmt.Errorf("looking for pg_cron: %w", err)
		}
		state := "pg_cron's cron.schedule is there"
		if !cron {
			state = "pg_cron's cron.schedule is MISSING: apply refuses the hop to 0.17.1 until pg_cron (>= 1.5) is installed"
		}
		out = append(out, c.finding(1, "telemetry: 0.17.1 schedules pg_cron job pgflow_telemetry_report (daily; it posts pgflow_telemetry.preview()'s "+
			"anonymous usage counts through pg_net); apply --telemetry off opts out in the same transaction; "+state, nil))
	}
	return out, nil
}
