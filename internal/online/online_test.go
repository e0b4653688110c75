package online_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// inflight returns a fresh database holding the old model's inflight state
// (see model_test.go).
func inflight(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Empty(t)
	st, err := fixtures.LookupModel("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), db.Pool); err != nil {
		t.Fatalf("loading inflight: %v", err)
	}
	return db
}

func connect(t *testing.T, db *testdb.DB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustShape(t *testing.T, db *testdb.DB) online.Shape {
	t.Helper()
	s, err := online.Detect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkUpgraded: verify passes, every row and message survived, the new
// columns are right, and nothing of the online upgrade is left.
func checkUpgraded(t *testing.T, db *testdb.DB, before *fingerprint.Fingerprint) {
	t.Helper()
	ctx := context.Background()
	verifyModel(t, db)
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		if d := fingerprint.Compare(before, after); len(d) > 0 {
			t.Fatalf("%d differences:\n%s", len(d), fingerprint.Format(d, 20))
		}
	}
	var wrong int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.step_tasks where queue_name is distinct from flow_slug`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d tasks whose queue_name is not their flow's (%v)", wrong, err)
	}
	// Nothing of the online upgrade is left; the revision record stays.
	var leftovers int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
		where n.nspname = 'pgflow_upgrade' and c.relname <> 'schema_revisions' and c.relname <> 'schema_revisions_pkey'`).Scan(&leftovers); err != nil {
		t.Fatal(err)
	}
	if leftovers != 0 {
		t.Fatal("objects of the online upgrade left in schema pgflow_upgrade after the switch")
	}
}

// stopOnlineAt runs apply --online until it reaches point (for PointBatch,
// the third batch, so that some rows are filled and some are not) and stops
// it there, as an interrupt would.
func stopOnlineAt(t *testing.T, conn *pgx.Conn, point string) {
	t.Helper()
	stop := errors.New("stop")
	seen := 0
	_, err := online.Apply(context.Background(), conn, withModel(online.Options{BatchSize: 7, Hooks: online.Hooks{At: func(_ context.Context, _ uint32, p string) error {
		if p == point {
			seen++
			if p != online.PointBatch || seen == 3 {
				return stop
			}
		}
		return nil
	}}}))
	if !errors.Is(err, stop) {
		t.Fatalf("did not stop at %s: %v", point, err)
	}
}

func TestApplyOnlineInflight(t *testing.T) {
	ctx := context.Background()
	db := inflight(t)
	before, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	conn := connect(t, db)
	rep, err := online.Apply(ctx, conn, withModel(online.Options{BatchSize: 7}))
	if err != nil {
		t.Fatalf("apply --online: %v (%+v)", err, rep)
	}
	if rep.Outcome != upgrade.OutcomeApplied {
		t.Fatalf("outcome %s: %s", rep.Outcome, rep.Message)
	}
	if rep.Backfill.Batches < 2 || rep.Backfill.Rows == 0 {
		t.Fatalf("backfill did %d rows in %d batches; want several batches", rep.Backfill.Rows, rep.Backfill.Batches)
	}
	t.Logf("report: %s; phases %+v; locks %+v; backfill %+v", rep.Message, rep.Phases, rep.Locks, rep.Backfill)
	checkUpgraded(t, db, before)

	// A rerun is a no-op that says so.
	rep, err = online.Apply(ctx, conn, withModel(online.Options{}))
	if err != nil || rep.Outcome != upgrade.OutcomeAlreadyApplied {
		t.Fatalf("rerun: %v, outcome %s", err, rep.Outcome)
	}
}

// An online upgrade stopped in each phase rolls back to the exact 0.16.0
// baseline: same schema state, every row identical, no trigger, check,
// index or schema of ours; and it can then be upgraded again.
func TestRollbackOnline(t *testing.T) {
	for _, stopAt := range []string{online.PointBatch, online.PointCheck, online.PointValidate, online.PointIndex, online.PointSwitch} {
		t.Run(stopAt, func(t *testing.T) {
			ctx := context.Background()
			db := inflight(t)
			before, err := fingerprint.Take(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			conn := connect(t, db)
			stopOnlineAt(t, conn, stopAt)
			if s := mustShape(t, db); !s.Started() {
				t.Fatalf("nothing of the online upgrade is there after stopping at %s: %+v", stopAt, s)
			}
			rr, err := online.Rollback(ctx, conn, online.RollbackOptions{})
			if err != nil || rr.Outcome != "rolled_back" {
				t.Fatalf("rollback: %v %+v", err, rr)
			}
			st, err := upgrade.DetectState(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != "baseline" {
				t.Fatalf("after rollback: state %s %v", st.State, st.Differences)
			}
			if s := mustShape(t, db); s.Started() || s.Column {
				t.Fatalf("leftovers after rollback: %+v", s)
			}
			after, err := fingerprint.Take(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if d := fingerprint.Compare(before, after); len(d) > 0 {
				t.Fatalf("rollback changed rows:\n%s", fingerprint.Format(d, 20))
			}
			if d := fingerprint.Added(before, after); len(d) > 0 {
				t.Fatalf("rollback left rows or tables:\n%s", fingerprint.Format(d, 20))
			}
			rr, err = online.Rollback(ctx, conn, online.RollbackOptions{})
			if err != nil || rr.Outcome != "nothing_to_do" {
				t.Fatalf("second rollback: %v %+v", err, rr)
			}
			rep, err := online.Apply(ctx, conn, withModel(online.Options{}))
			if err != nil || rep.Outcome != upgrade.OutcomeApplied {
				t.Fatalf("apply --online after the rollback: %v %+v", err, rep)
			}
			checkUpgraded(t, db, before)
		})
	}
}

// The migration file, run by hand (psql -1) on an online-prepared database,
// finishes the upgrade too: its guard accepts the prepared shape.
func TestMigrationFileOnPreparedShape(t *testing.T) {
	ctx := context.Background()
	db := inflight(t)
	conn := connect(t, db)
	stopOnlineAt(t, conn, online.PointSwitch)
	if s := mustShape(t, db); !s.Prepared() {
		t.Fatalf("not prepared: %+v", s)
	}
	if err := runFile(ctx, conn, modelMigrationSQL(t)); err != nil {
		t.Fatalf("the file on the prepared shape: %v", err)
	}
	verifyModel(t, db)
	// A column that is there in another shape is refused, not rewritten.
	db2 := inflight(t)
	if _, err := db2.Pool.Exec(ctx, `alter table pgflow.step_tasks add column queue_name text`); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, db2.Pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, modelMigrationSQL(t)); return err })
	if err == nil || !strings.Contains(err.Error(), "not in the shape an online upgrade prepares") {
		t.Fatalf("file on a half-made column: %v", err)
	}
}

// An online upgrade stopped at each point continues to a correct upgraded
// database when apply --online runs again (no rollback in between). The
// stop after the NOT VALID check is the case that once failed: the catalog
// prints that check with " NOT VALID", and a rerun tried to add it again.
func TestResumeOnlineFromEveryPoint(t *testing.T) {
	for _, stopAt := range []string{online.PointExpand, online.PointBatch, online.PointCheck, online.PointValidate, online.PointIndex, online.PointSwitch} {
		t.Run(stopAt, func(t *testing.T) {
			ctx := context.Background()
			db := inflight(t)
			before, err := fingerprint.Take(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			conn := connect(t, db)
			stopOnlineAt(t, conn, stopAt)
			shape := mustShape(t, db)
			if stopAt == online.PointValidate && (!shape.Check || shape.CheckValid) {
				t.Fatalf("stopped before VALIDATE, want the check there and not validated: %+v", shape)
			}
			rep, err := online.Apply(ctx, conn, withModel(online.Options{BatchSize: 7}))
			if err != nil || rep.Outcome != upgrade.OutcomeApplied {
				t.Fatalf("rerun after stopping at %s (shape %+v): %v %+v", stopAt, shape, err, rep)
			}
			if stopAt != online.PointExpand && !rep.Resumed {
				t.Fatalf("rerun after %s does not say it resumed", stopAt)
			}
			checkUpgraded(t, db, before)
		})
	}
}

// A constraint that has the check's name but not its definition is refused
// with a message naming it, not retried into "already exists".
func TestOnlineRefusesForeignCheck(t *testing.T) {
	ctx := context.Background()
	db := inflight(t)
	conn := connect(t, db)
	stopOnlineAt(t, conn, online.PointCheck)
	if _, err := db.Pool.Exec(ctx, `alter table pgflow.step_tasks add constraint `+online.CheckName+` check (queue_name <> '') not valid`); err != nil {
		t.Fatal(err)
	}
	if s := mustShape(t, db); s.Check || !s.CheckForeign {
		t.Fatalf("shape %+v: want CheckForeign", s)
	}
	rep, err := online.Apply(ctx, conn, withModel(online.Options{}))
	if !errors.Is(err, online.ErrRefused) || rep.Outcome != upgrade.OutcomeRefused || !strings.Contains(err.Error(), online.CheckName) {
		t.Fatalf("want a refusal naming %s: %v (%s)", online.CheckName, err, rep.Outcome)
	}
}
