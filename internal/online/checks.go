package online

import (
	"context"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// onlineDifference: a difference from the 0.16.0 description that an
// online upgrade in progress makes: the new, still nullable
// step_tasks.queue_name column (its check, index and trigger are additions
// detection tolerates, so they are no differences).
func onlineDifference(d catalog.Difference) bool {
	return d.Kind == catalog.KindColumn && d.Table == "step_tasks" && d.Name == "queue_name" && d.Change == catalog.ChangeExtra
}

// baselineOrOnline: the 0.16.0 baseline, or the baseline plus what an
// unfinished online upgrade adds, and nothing else.
func baselineOrOnline(info audit.SchemaInfo) bool {
	if info.State == audit.StateBaseline {
		return true
	}
	d := info.Version
	if d == nil || d.State != versions.StateUnknown || len(d.Differences) == 0 ||
		(d.Closest != versions.V0_16_0 && d.Closest != versions.ModelBaseline) {
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
		ID: CheckStateID, Title: "pgflow 0.16.0, or 0.16.0 with an unfinished online upgrade", Severity: audit.Blocker, Preflight: true,
		Meaning: "apply --online starts from the 0.16.0 baseline, or continues its own unfinished run (step_tasks.queue_name, its trigger, check and index); anything else blocks.",
		Remedy:  "Run `pgflow-upgrade status` and `pgflow-upgrade audit`: a partial schema must be repaired (or rolled back with `pgflow-upgrade apply --rollback-online` when it is an online upgrade's) first.",
		Run: func(ctx context.Context, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			if baselineOrOnline(env.Schema) {
				return nil, nil
			}
			s, err := Detect(ctx, q)
			if err != nil {
				return nil, err
			}
			msg := "schema state " + string(env.Schema.State) + ": " + strings.Join(env.Schema.Differences, "; ")
			if s.FlowsColumn {
				msg += " (pgflow.flows.queue_name exists: not a shape apply --online makes)"
			}
			return []audit.Finding{finding(CheckStateID, msg, "Run `pgflow-upgrade status`; restore the 0.16.0 schema (or roll back an online upgrade) first.")}, nil
		},
	}
}

// preparedCheck replaces schema.state and tasks.duplicate_message_id in the
// switch transaction, under its locks: the shape is exactly what the
// contract phase left, so the validated check (queue_name = flow_slug on
// every row) and the valid unique index on (queue_name, message_id) prove,
// from the catalog, that no two tasks of one flow share a message id — the
// exact answer the scan of duplicate_message_id gives, without reading 5M
// rows while the tables are locked.
func preparedCheck() audit.Check {
	return audit.Check{
		ID: CheckPreparedID, Title: "online-prepared shape (column, validated check, valid unique address index)", Severity: audit.Blocker, Preflight: true,
		Meaning: "The switch starts only from the shape the contract phase prepared; its validated check and valid unique index also prove that no two tasks of a flow share a message id.",
		Remedy:  "Run `pgflow-upgrade apply --online` again: it redoes what is missing.",
		Run: func(ctx context.Context, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			s, err := Detect(ctx, q)
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

// preflightIDs are audit's Preflight checks without the ones in skip.
func preflightIDs(skip ...string) []string {
	var out []string
	for _, c := range audit.Catalog() {
		if !c.Preflight {
			continue
		}
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
