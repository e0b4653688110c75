package upgrade_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

func fastOpts() upgrade.Options {
	return upgrade.Options{Wait: 0, LockTimeout: upgrade.DefaultLockTimeout, LockRetries: 1}
}

func TestApplyInflight(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Inflight(t, 3)
	var flowsBefore, tasksBefore int
	if err := db.Pool.QueryRow(ctx, `select (select count(*) from pgflow.flows), (select count(*) from pgflow.step_tasks)`).Scan(&flowsBefore, &tasksBefore); err != nil {
		t.Fatal(err)
	}
	if flowsBefore == 0 || tasksBefore == 0 {
		t.Fatalf("inflight has %d flows and %d tasks; the test needs both", flowsBefore, tasksBefore)
	}

	rep, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts())
	if err != nil {
		t.Fatalf("apply: %v\n%+v", err, rep)
	}
	if rep.Outcome != outcome.Applied {
		t.Fatalf("outcome %s, want applied: %s", rep.Outcome, rep.Message)
	}
	if rep.Report.LockAttempts != 1 || len(rep.Report.Statements) == 0 {
		t.Fatalf("lock attempts %d, statements %d", rep.Report.LockAttempts, len(rep.Report.Statements))
	}

	// Every step and task holds lower(flow_slug), every flow is in flow mode.
	var badSteps, badTasks, badFlows, tasks int
	if err := db.Pool.QueryRow(ctx, `select (select count(*) from pgflow.steps where queue_name is distinct from lower(flow_slug)),
	        (select count(*) from pgflow.step_tasks where queue_name is distinct from lower(flow_slug)),
	        (select count(*) from pgflow.flows where queue_mode is distinct from 'flow'),
	        (select count(*) from pgflow.step_tasks)`).Scan(&badSteps, &badTasks, &badFlows, &tasks); err != nil {
		t.Fatal(err)
	}
	if badSteps != 0 || badTasks != 0 || badFlows != 0 || tasks != tasksBefore {
		t.Fatalf("steps with wrong queue_name %d, tasks with wrong queue_name %d, flows not in flow mode %d, tasks %d (before %d)",
			badSteps, badTasks, badFlows, tasks, tasksBefore)
	}
	if v := scalarOf[string](t, db, `select name from pgflow_upgrade.schema_revisions where version = $1`, upgrade.Version); v != upgrade.Name {
		t.Fatalf("revision recorded as %q", v)
	}
	if !strings.Contains(rep.Report.Supabase, upgrade.SupabaseRepairCommand) {
		t.Fatalf("without --supabase-dir the report must say what to run: %q", rep.Report.Supabase)
	}
	for _, pc := range rep.Report.PostConditions {
		if !pc.OK {
			t.Errorf("post-condition %s failed: %s", pc.ID, pc.Detail)
		}
	}

	// A rerun is a no-op that says so.
	before := testdb.State(t, db.Pool)
	rep2, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts())
	if err != nil {
		t.Fatalf("rerun: %v", err)
	}
	if rep2.Outcome != outcome.AlreadyApplied || !strings.Contains(rep2.Message, "already upgraded") || !strings.Contains(rep2.Message, "nothing to do") {
		t.Fatalf("rerun outcome %s: %s", rep2.Outcome, rep2.Message)
	}
	if rep2.Report.LockAttempts != 0 {
		t.Fatalf("the rerun took table locks (%d attempts)", rep2.Report.LockAttempts)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "rerun")

	vr, err := upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
	if err != nil || !vr.OK {
		t.Fatalf("verify after apply: %v %+v", err, vr)
	}
}

func TestApplyRefusesCaseAliases(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Inflight(t, 3)
	// Directly, as the engine would not stop it: two slugs that differ only in case.
	if _, err := db.Pool.Exec(ctx, `insert into pgflow.flows (flow_slug) values ('Foo'), ('foo')`); err != nil {
		t.Fatal(err)
	}
	before := testdb.State(t, db.Pool)
	rep, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts())
	if !errors.Is(err, outcome.ErrPreflight) {
		t.Fatalf("apply: %v, want ErrPreflight (%+v)", err, rep)
	}
	if rep.Outcome != outcome.Refused || len(rep.Report.Blockers) == 0 {
		t.Fatalf("outcome %s, blockers %v", rep.Outcome, rep.Report.Blockers)
	}
	found := false
	for _, b := range rep.Report.Blockers {
		if strings.Contains(b.Message+b.CheckID, "Foo") || strings.Contains(b.CheckID, "case") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no blocker names the case-only aliases: %+v", rep.Report.Blockers)
	}
	for _, st := range rep.Report.Steps {
		if st.Step == upgrade.StepMigrate {
			t.Fatalf("the migration ran despite a blocker")
		}
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply")
}

func scalarOf[T any](t *testing.T, db *testdb.DB, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := db.Pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return v
}
