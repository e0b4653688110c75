package online_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// inflight returns a fresh database holding fixtures' inflight state.
func inflight(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Empty(t)
	st, err := fixtures.Lookup("inflight")
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
	conn := connect(t, db)
	v, err := upgrade.Verify(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK {
		t.Fatalf("verify failed: %+v", upgrade.Failed(v.Checks))
	}
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		if d := fingerprint.Compare(before, after); len(d) > 0 {
			t.Fatalf("%d differences:\n%s", len(d), fingerprint.Format(d, 20))
		}
	}
	d, err := fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) > 0 {
		t.Fatalf("new columns wrong:\n%s", fingerprint.Format(d, 20))
	}
	var leftovers int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pg_namespace where nspname = 'pgflow_upgrade'`).Scan(&leftovers); err != nil {
		t.Fatal(err)
	}
	if leftovers != 0 {
		t.Fatal("schema pgflow_upgrade left behind after the switch")
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
	rep, err := online.Apply(ctx, conn, online.Options{BatchSize: 7})
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
	rep, err = online.Apply(ctx, conn, online.Options{})
	if err != nil || rep.Outcome != upgrade.OutcomeAlreadyApplied {
		t.Fatalf("rerun: %v, outcome %s", err, rep.Outcome)
	}
}

func TestSwitchSteps(t *testing.T) {
	ctx := context.Background()
	db := inflight(t)
	conn := connect(t, db)
	rep, err := online.Apply(ctx, conn, online.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Switch.Steps {
		t.Logf("%s %d ms", s.Step, s.DurationMS)
	}
	for _, s := range rep.Switch.Statements {
		if s.DurationMS > 1 {
			t.Logf("stmt %d %s %d ms", s.Index, s.Summary, s.DurationMS)
		}
	}
	for _, c := range rep.Switch.Preflight {
		t.Logf("check %s %d ms", c.ID, c.DurationMS)
	}
}
