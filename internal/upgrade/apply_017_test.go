package upgrade_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// Every data condition that makes the 0.17.0 change fail is refused by the
// preflight under the locks, with a count, samples and a remedy, before the
// migration runs; the database is unchanged.
func TestApplyPreflightRefusals(t *testing.T) {
	cases := []struct {
		name, setup, check string
	}{
		{"flows differing only by case", `insert into pgflow.flows (flow_slug) values ('Orders'), ('orders')`, "flows.case_alias"},
		{"steps differing only by case", `insert into pgflow.flows (flow_slug) values ('shop');
			insert into pgflow.steps (flow_slug, step_slug, step_index) values ('shop', 'Pay', 0), ('shop', 'pay', 1)`, "steps.case_alias"},
		{"slug with a leading underscore", `insert into pgflow.flows (flow_slug) values ('_hidden')`, "slugs.strict_rule"},
		{"slug with a trailing underscore", `insert into pgflow.flows (flow_slug) values ('ok');
			insert into pgflow.steps (flow_slug, step_slug) values ('ok', 'step_')`, "slugs.strict_rule"},
		{"slug with a double underscore", `insert into pgflow.flows (flow_slug) values ('a__b')`, "slugs.strict_rule"},
		{"lower(flow_slug) over 47 characters", `insert into pgflow.flows (flow_slug) values ('` + strings.Repeat("x", 48) + `');
			insert into pgflow.steps (flow_slug, step_slug) values ('` + strings.Repeat("x", 48) + `', 's')`, "flows.queue_name_too_long"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testCtx(t)
			db := testdb.Baseline(t)
			if _, err := db.Pool.Exec(ctx, c.setup); err != nil {
				t.Fatal(err)
			}
			before := testdb.State(t, db.Pool)
			rep, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts())
			if !errors.Is(err, outcome.ErrPreflight) || rep.Outcome != outcome.Refused {
				t.Fatalf("apply: %v (outcome %s), want a preflight refusal", err, rep.Outcome)
			}
			var found bool
			for _, b := range rep.Report.Blockers {
				if b.CheckID == c.check {
					found = b.Count > 0 && len(b.Samples) > 0 && b.Remedy != ""
				}
			}
			if !found {
				t.Fatalf("no %s blocker with count, samples and remedy: %+v", c.check, rep.Report.Blockers)
			}
			for _, st := range rep.Report.Steps {
				if st.Step == upgrade.StepMigrate {
					t.Fatal("the migration ran despite a blocker")
				}
			}
			testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply")
		})
	}
}

// A database upgraded by pgflow's own migration (here: the file run as a
// plain transaction, recording nothing of ours) is 0.17.0 to apply, status
// and verify.
func TestUpgradedElsewhereIs017(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Inflight(t, 3)
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, all[0].SQL)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	before := testdb.State(t, db.Pool)
	rep, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts())
	if err != nil || rep.Outcome != outcome.AlreadyApplied || !strings.Contains(rep.Message, "not applied by this tool") {
		t.Fatalf("apply on 0.17.0: %v %s %q", err, rep.Outcome, rep.Message)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "apply on 0.17.0")
	st, err := upgrade.Status(ctx, testdb.Connect(t, db.DSN))
	if err != nil || len(st.Pending) != 0 || st.NeedsAttention() {
		t.Fatalf("status: %v %+v", err, st)
	}
	vr, err := upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
	if err != nil || !vr.OK {
		t.Fatalf("verify: %v %+v", err, vr)
	}
}

// The outcome is the result's, one JSON object with the report's members
// after outcome and message; Want names an outcome other than the one
// wanted; a success is what a nil error comes with.
func TestResult(t *testing.T) {
	res := &outcome.Result[*upgrade.Report]{Outcome: outcome.AlreadyApplied, Message: "already upgraded", Report: &upgrade.Report{TotalMS: 7}}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"outcome":"already_applied","message":"already upgraded","dry_run":false,`) || !strings.Contains(string(b), `"total_ms":7`) {
		t.Fatalf("JSON %s", b)
	}
	if err := res.Want(outcome.AlreadyApplied); err != nil {
		t.Fatal(err)
	}
	if err := res.Want(outcome.Applied); err == nil || !strings.Contains(err.Error(), "outcome already_applied, want applied: already upgraded") {
		t.Fatalf("Want: %v", err)
	}
	for _, o := range []outcome.Outcome{outcome.Refused, outcome.LockBusy, outcome.Inconclusive, outcome.Interrupted, outcome.Failed} {
		if o.Succeeded() {
			t.Fatalf("%s succeeded", o)
		}
	}
	if !outcome.DryRun.Succeeded() || !outcome.RolledBack.Succeeded() {
		t.Fatal("dry_run and rolled_back are successes")
	}
}
