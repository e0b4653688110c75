package audit

import (
	"context"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// schemaState is schema.state.
var schemaState = Check{
	ID: "schema.state", Title: "pgflow version and schema state", Severity: Blocker, Runs: InAudit | UnderLocks,
	Meaning: "The live catalog is compared with every pgflow version this tool knows (internal/versions: 0.14.x, 0.15.x, 0.16.0, 0.17.0, 0.17.1+), " +
		"tolerating what users add (their own indexes, constraints, functions). A release on the way to upstream's newest (0.14.1 to 0.17.1, told exactly) " +
		"is reported as info; an older version whose release cannot be told, a schema no known version matches (the differences from the closest one named) " +
		"or no pgflow schema is a blocker.",
	Remedy: "Older than 0.16.0 and not told exactly: upgrade pgflow to 0.16.0 first with pgflow's own installer. Unknown: restore what differs from the closest " +
		"version (or restore from backup), then audit again. No pgflow schema: point --dsn at the right database.",
	Run: checkSchemaState,
}

func checkSchemaState(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	s := env.Schema
	var samples []map[string]any
	for _, d := range s.Differences {
		if len(samples) < env.Sample {
			samples = append(samples, map[string]any{"difference": d})
		}
	}
	f := c.finding(int64(len(s.Differences)), "schema state "+string(s.State)+": "+s.Describe(), samples)
	switch s.State {
	case versions.SchemaBaseline:
		f.Severity, f.Remedy, f.Count = Info, "None: this is the shape apply starts from.", 0
	case versions.SchemaUpgraded:
		f.Severity, f.Remedy, f.Count = Info, "None: apply will report that there is nothing to do.", 0
	case versions.SchemaOlder:
		f.Count = 1
		if s.Version.PlanStarts() {
			// On the road: apply runs upstream's files up to 0.16.0 first.
			f.Severity, f.Count = Info, 0
			f.Remedy = "None: apply takes it to upstream's newest release, running upstream's files from your copy (--pgflow-migrations) up to 0.16.0 first (plan.hops lists every hop)."
		}
	case versions.SchemaPartial:
		// Between the two shapes by design while an online upgrade of ours
		// runs (the version detection names it, with its phase): a state
		// with a next command, as `status` says, not a damaged schema. With
		// its progress table (which exists only while one of ours runs) it is
		// a warning in the audit; the preflight keeps it a blocker (apply
		// starts from the baseline only).
		v := s.Version
		if v == nil || v.Online == nil {
			break
		}
		f.Message = "an online upgrade (apply --online) is in progress (phase " + v.Online.Phase + "): the schema is between 0.16.0 and the upgraded shape until it ends"
		if len(s.Differences) > 0 {
			f.Message += "; what differs from 0.16.0 so far: " + strings.Join(s.Differences, "; ")
		}
		f.Remedy = "Continue it with `" + v.Online.Continue + "`, or undo it with `" + v.Online.Undo + "`; `pgflow-upgrade status` shows its phase and progress."
		var progress bool
		if env.Mode == ModeAudit {
			if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.online_progress') is not null`).Scan(&progress); err != nil {
				return nil, err
			}
		}
		if progress {
			f.Severity = Warning
		}
	}
	if s.Version != nil && f.Severity == Blocker {
		f.Remedy = s.Version.NextStep // what to do about this version
	}
	return []Finding{f}, nil
}
