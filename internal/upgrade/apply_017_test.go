package upgrade_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
			rep, err := upgrade.Apply(ctx, connect(t, db), fastOpts())
			if !errors.Is(err, upgrade.ErrPreflight) || upgrade.OutcomeOf(err) != upgrade.OutcomeRefused {
				t.Fatalf("apply: %v (outcome %s), want a preflight refusal", err, upgrade.OutcomeOf(err))
			}
			var found bool
			for _, b := range rep.Blockers {
				if b.CheckID == c.check {
					found = b.Count > 0 && len(b.Samples) > 0 && b.Remedy != ""
				}
			}
			if !found {
				t.Fatalf("no %s blocker with count, samples and remedy: %+v", c.check, rep.Blockers)
			}
			for _, st := range rep.Steps {
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
	db := inflightDB(t)
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
	rep, err := upgrade.Apply(ctx, connect(t, db), fastOpts())
	if err != nil || rep.Outcome != upgrade.OutcomeAlreadyApplied || !strings.Contains(rep.Message, "not applied by this tool") {
		t.Fatalf("apply on 0.17.0: %v %s %q", err, rep.Outcome, rep.Message)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "apply on 0.17.0")
	st, err := upgrade.Status(ctx, connect(t, db))
	if err != nil || len(st.Pending) != 0 || st.NeedsAttention() {
		t.Fatalf("status: %v %+v", err, st)
	}
	vr, err := upgrade.Verify(ctx, connect(t, db))
	if err != nil || !vr.OK {
		t.Fatalf("verify: %v %+v", err, vr)
	}
}

// The outcome travels in the error: errors.As and errors.Is by outcome.
func TestOutcomeInError(t *testing.T) {
	err := error(&upgrade.Error{Outcome: upgrade.OutcomeLockBusy, Err: upgrade.ErrUpgradeLocked})
	var ae *upgrade.Error
	if !errors.As(err, &ae) || ae.Outcome != upgrade.OutcomeLockBusy {
		t.Fatal("errors.As")
	}
	if !errors.Is(err, &upgrade.Error{Outcome: upgrade.OutcomeLockBusy}) || errors.Is(err, &upgrade.Error{Outcome: upgrade.OutcomeRefused}) {
		t.Fatal("errors.Is by outcome")
	}
	if !errors.Is(err, upgrade.ErrUpgradeLocked) {
		t.Fatal("the cause is not reachable")
	}
	if upgrade.OutcomeOf(nil) != "" || upgrade.OutcomeOf(errors.New("x")) != upgrade.OutcomeFailed {
		t.Fatal("OutcomeOf")
	}
}
