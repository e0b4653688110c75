package online

import (
	"context"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// onlineDifference: a difference from the 0.16.0 description that an
// online upgrade in progress makes before its switch: the new, still
// nullable steps.queue_name and step_tasks.queue_name columns and
// pgflow.is_valid_queue_name(text) (its checks, indexes and triggers are
// additions detection tolerates, so they are no differences).
// flows.queue_mode and the 0.17 protocol functions come with the switch
// only, so they are never an online difference.
func onlineDifference(d catalog.Difference) bool {
	switch {
	case d.Kind == catalog.KindColumn && d.Change == catalog.ChangeExtra && d.Name == "queue_name":
		return d.Table == "steps" || d.Table == "step_tasks"
	case d.Kind == catalog.KindFunction && d.Change == catalog.ChangeExtra:
		return d.Name == "is_valid_queue_name" || strings.HasPrefix(d.Name, "is_valid_queue_name(")
	}
	return false
}

// baselineOrOnline: the 0.16.0 baseline, or the baseline plus what an
// unfinished online upgrade adds, and nothing else.
func baselineOrOnline(info versions.SchemaInfo) bool {
	if info.State == versions.SchemaBaseline {
		return true
	}
	d := info.Version
	if d == nil || (d.State != versions.StateUnknown && d.State != versions.StateOnline) {
		return false
	}
	if d.State == versions.StateOnline && d.Found == versions.V0_16_0 {
		return true // 0.16.0 plus additions only (the online objects are additions until the columns come)
	}
	if len(d.Differences) == 0 || d.Closest != versions.V0_16_0 {
		return false
	}
	for _, x := range d.Differences {
		if !onlineDifference(x) {
			return false
		}
	}
	return true
}

// Check IDs of the online upgrade's own preflight checks.
const (
	CheckStateID    = "online.schema_state"
	CheckPreparedID = "online.prepared"
)

// stateCheck replaces audit's schema.state before the expand: it accepts
// the baseline and an unfinished online upgrade (a rerun continues it).
func stateCheck() audit.Check {
	return audit.Check{
		ID: CheckStateID, Title: "pgflow 0.16.0, or 0.16.0 with an unfinished online upgrade", Severity: audit.Blocker, Runs: audit.UnderLocks,
		Meaning: "apply --online starts from the 0.16.0 baseline, or continues its own unfinished run (steps/step_tasks.queue_name, their triggers and checks, pgflow.is_valid_queue_name, the unique indexes); anything else blocks.",
		Remedy:  "Run `pgflow-upgrade status` and `pgflow-upgrade audit`: a partial schema must be repaired (or rolled back with `pgflow-upgrade apply --rollback-online` when it is an online upgrade's) first.",
		Run: func(ctx context.Context, _ audit.Check, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			if baselineOrOnline(env.Schema) {
				return nil, nil
			}
			s, err := ReadShape(ctx, q)
			if err != nil {
				return nil, err
			}
			msg := "schema state " + string(env.Schema.State) + ": " + strings.Join(env.Schema.Differences, "; ")
			if s.Upgraded {
				msg += " (pgflow.flows.queue_mode exists: not a shape apply --online makes before its switch)"
			}
			return []audit.Finding{finding(CheckStateID, msg, "Run `pgflow-upgrade status`; restore the 0.16.0 schema (or roll back an online upgrade) first.")}, nil
		},
	}
}

// preparedCheck replaces schema.state, tasks.duplicate_message_id,
// flows.case_alias and steps.case_alias in the switch transaction, under its
// locks: the shape is exactly what the contract phase left, so the validated
// check (queue_name = lower(flow_slug) on every row) and the valid unique
// indexes (idx_step_tasks_queue_message, idx_flows_normalized_slug,
// idx_steps_normalized_slug, enforced on every write since they were built)
// prove, from the catalog, that no two tasks share a (queue, message id) and
// no slugs differ only by case — the answers those scans give, without
// reading a table while the tables are locked.
func preparedCheck() audit.Check {
	return audit.Check{
		ID: CheckPreparedID, Title: "online-prepared shape (columns, validated checks, valid unique indexes)", Severity: audit.Blocker, Runs: audit.UnderLocks,
		Meaning: "The switch starts only from the shape the contract phase prepared; its validated checks and valid unique indexes also prove that no two tasks share a (queue, message id) and no slugs differ only by case.",
		Remedy:  "Run `pgflow-upgrade apply --online` again: it redoes what is missing.",
		Run: func(ctx context.Context, _ audit.Check, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			s, err := ReadShape(ctx, q)
			if err != nil {
				return nil, err
			}
			if s.Prepared() && baselineOrOnline(env.Schema) {
				return nil, nil
			}
			return []audit.Finding{finding(CheckPreparedID, "not the online-prepared shape: phase "+string(s.Phase()), "Run `pgflow-upgrade apply --online` again.")}, nil
		},
	}
}

func finding(id, msg, remedy string) audit.Finding {
	return audit.Finding{CheckID: id, Severity: audit.Blocker, Count: 1, Message: msg, Remedy: remedy, Samples: []map[string]any{}}
}

// preflightIDs are audit's checks of every plan declared UnderLocks,
// without the ones in skip.
func preflightIDs(skip ...string) []string {
	var out []string
	for _, c := range audit.For(audit.UnderLocks, audit.EveryPlan) {
		keep := true
		for _, s := range skip {
			keep = keep && c.ID != s
		}
		if keep {
			out = append(out, c.ID)
		}
	}
	return out
}
