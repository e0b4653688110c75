package online_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func mustShape(t *testing.T, db *testdb.DB) online.Shape {
	t.Helper()
	s, err := online.ReadShape(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readCatalog(t *testing.T, pool *pgxpool.Pool) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Read(context.Background(), pool, "pgflow")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sameCatalog fails unless got equals want exactly (pgmq's version aside:
// it is the test server's).
// assertNothingLeft fails unless the online upgrade left nothing behind:
// no online object in pgflow, no schema pgflow_upgrade, and every row as it
// was in before (none changed, none added).
func assertNothingLeft(t *testing.T, db *testdb.DB, before *fingerprint.Fingerprint, when string) {
	t.Helper()
	ctx := context.Background()
	if s := mustShape(t, db); s.Started() {
		t.Fatalf("online leftovers %s: %+v", when, s)
	}
	var schema bool
	if err := db.Pool.QueryRow(ctx, `select exists (select 1 from pg_namespace where nspname = 'pgflow_upgrade')`).Scan(&schema); err != nil || schema {
		t.Fatalf("schema pgflow_upgrade left %s (%v)", when, err)
	}
	after := db.Fingerprint(t)
	if d := fingerprint.Compare(before, after); len(d) > 0 {
		t.Fatalf("rows changed %s:\n%s", when, fingerprint.Format(d, 20))
	}
	if d := fingerprint.Added(before, after); len(d) > 0 {
		t.Fatalf("rows or tables added %s:\n%s", when, fingerprint.Format(d, 20))
	}
}

func sameCatalog(t *testing.T, what string, want, got *catalog.Catalog) {
	t.Helper()
	got.PGMQ = want.PGMQ
	if d := catalog.Diff(want, got); len(d) > 0 {
		t.Fatalf("%s: the catalog differs:\n  %s", what, strings.Join(catalog.Strings(d), "\n  "))
	}
}

// checkUpgraded: the catalog is exactly upstream's 0.17.0 (no trigger, no
// online check left), verify passes, every row and message survived, the new
// columns are right, and nothing of the online bookkeeping is left.
func checkUpgraded(t *testing.T, db *testdb.DB, before *fingerprint.Fingerprint) {
	t.Helper()
	ctx := context.Background()
	want, err := upgrade.Want017()
	if err != nil {
		t.Fatal(err)
	}
	sameCatalog(t, "after apply --online, against pgflow 0.17.0", want, readCatalog(t, db.Pool))
	conn := testdb.Connect(t, db.DSN)
	v, err := upgrade.Verify(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK {
		t.Fatalf("verify failed: %+v", upgrade.Failed(v.Checks))
	}
	after := db.Fingerprint(t)
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
	if err := db.Pool.QueryRow(ctx, `select (select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace
		                                      where n.nspname = 'pgflow_upgrade' and c.relname = 'online_progress')
		                              + (select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
		                                 where n.nspname = 'pgflow_upgrade')
		                              + (select count(*) from pg_trigger where tgname = $1)`, online.TriggerName).Scan(&leftovers); err != nil {
		t.Fatal(err)
	}
	if leftovers != 0 {
		t.Fatalf("%d objects of the online upgrade left behind after the switch", leftovers)
	}
	var revision bool
	if err := db.Pool.QueryRow(ctx, `select exists (select 1 from pgflow_upgrade.schema_revisions where version = $1)`, upgrade.Version).Scan(&revision); err != nil || !revision {
		t.Fatalf("the revision is not recorded in pgflow_upgrade.schema_revisions: %v", err)
	}
}

// stopOnlineAt runs apply --online until it reaches point (for PointBatch,
// the third batch, so that some rows are filled and some are not; for
// PointIndex, the second index, so that one is built and two are not) and
// stops it there, as an interrupt would.
func stopOnlineAt(t *testing.T, conn *pgx.Conn, point string) {
	t.Helper()
	stop := errors.New("stop")
	seen := 0
	_, err := online.Upgrade(context.Background(), conn, online.Options{BatchSize: 7, Hooks: online.Hooks{At: func(_ context.Context, _ uint32, p string) error {
		if p == point {
			seen++
			if (p != online.PointBatch || seen == 3) && (p != online.PointIndex || seen == 2) {
				return stop
			}
		}
		return nil
	}}})
	if !errors.Is(err, stop) {
		t.Fatalf("did not stop at %s: %v", point, err)
	}
}

// applyOnline runs apply --online to the end (--batch-size 7, as
// stopOnlineAt) and fails the test unless it applied; what names the run in
// the failure.
func applyOnline(t *testing.T, conn *pgx.Conn, what string) *outcome.Result[*online.Report] {
	t.Helper()
	rep, err := online.Upgrade(context.Background(), conn, online.Options{BatchSize: 7})
	if err != nil || rep.Outcome != outcome.Applied {
		t.Fatalf("%s: %v %+v", what, err, rep)
	}
	return rep
}

var allPoints = []string{online.PointPreflight, online.PointExpand, online.PointBatch, online.PointCheck, online.PointValidate, online.PointIndex, online.PointSwitch}

func TestApplyOnlineInflight(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	before := db.Fingerprint(t)
	conn := testdb.Connect(t, db.DSN)
	rep, err := online.Upgrade(ctx, conn, online.Options{BatchSize: 7})
	if err != nil {
		t.Fatalf("apply --online: %v (%+v)", err, rep)
	}
	if rep.Outcome != outcome.Applied {
		t.Fatalf("outcome %s: %s", rep.Outcome, rep.Message)
	}
	if rep.Report.Backfill.Batches < 5 || rep.Report.Backfill.Rows < 40 || rep.Report.Backfill.Steps != 3 {
		t.Fatalf("backfill did %d tasks in %d batches and %d steps; want several batches, every task, 3 steps", rep.Report.Backfill.Rows, rep.Report.Backfill.Batches, rep.Report.Backfill.Steps)
	}
	// The switch's SET NOT NULL was proven by the validated check: the
	// migration ran on the prepared shape (no rewrite statement reported rows).
	if rep.Report.Switch == nil || rep.Report.Switch.Outcome != outcome.Applied {
		t.Fatalf("switch: %+v", rep.Report.Switch)
	}
	t.Logf("report: %s; phases %+v; locks %+v; backfill %+v", rep.Message, rep.Report.Phases, rep.Report.Locks, rep.Report.Backfill)
	checkUpgraded(t, db, before)

	// A rerun is a no-op that says so.
	rep, err = online.Upgrade(ctx, conn, online.Options{})
	if err != nil || rep.Outcome != outcome.AlreadyApplied {
		t.Fatalf("rerun: %v, outcome %s", err, rep.Outcome)
	}
}

// While the online upgrade is prepared but not switched, the 0.16.0 engine
// keeps working: new flows, steps and tasks get queue_name = lower(flow_slug)
// from the insert triggers, and the switch then ends at 0.17.0 exactly.
func TestZeroSixteenEngineDuringOnline(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	for _, point := range []string{online.PointBatch, online.PointSwitch} {
		stopOnlineAt(t, conn, point)
		flow := "Late_" + strings.ReplaceAll(point, ".", "_")
		for _, s := range []string{
			`select pgflow.create_flow('` + flow + `')`,
			`select pgflow.add_step('` + flow + `', 'only')`,
			`select pgflow.start_flow('` + flow + `', '{}')`,
			`select pgflow.start_flow('root_map', '[7, 8, 9]')`,
			`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 5)), '00000000-0000-0000-0000-0000000000aa')`,
		} {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				t.Fatalf("0.16.0 engine after stopping at %s: %s: %v", point, s, err)
			}
		}
		var wrong int
		if err := db.Pool.QueryRow(ctx, `select (select count(*) from pgflow.steps where flow_slug = $1 and queue_name is distinct from lower(flow_slug))
			+ (select count(*) from pgflow.step_tasks where flow_slug = $1 and queue_name is distinct from lower(flow_slug))`, flow).Scan(&wrong); err != nil {
			t.Fatal(err)
		}
		if wrong != 0 {
			t.Fatalf("%d new rows without queue_name = lower(flow_slug) after stopping at %s", wrong, point)
		}
	}
	applyOnline(t, conn, "apply --online")
	checkUpgraded(t, db, nil)
}

// An online upgrade stopped at each point rolls back to the exact 0.16.0
// catalog (compared object by object with the catalog read before) and
// rows; it can then be upgraded again.
func TestRollbackOnline(t *testing.T) {
	testdb.SkipIfShort(t, "An online upgrade stopped at each point rolls back to the exact 0.16.0 catalog...")
	for _, stopAt := range allPoints[2:] { // from the first batch on, something is there to undo
		t.Run(stopAt, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Inflight(t, 400)
			before := db.Fingerprint(t)
			cat016 := readCatalog(t, db.Pool)
			conn := testdb.Connect(t, db.DSN)
			stopOnlineAt(t, conn, stopAt)
			if s := mustShape(t, db); !s.Started() {
				t.Fatalf("nothing of the online upgrade is there after stopping at %s: %+v", stopAt, s)
			}
			rr, err := online.Rollback(ctx, conn, online.RollbackOptions{})
			if err != nil || rr.Outcome != "rolled_back" {
				t.Fatalf("rollback: %v %+v", err, rr)
			}
			sameCatalog(t, "after rollback-online, against the 0.16.0 catalog before", cat016, readCatalog(t, db.Pool))
			st, err := versions.DetectSchema(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if st.State != "baseline" {
				t.Fatalf("after rollback: state %s %v", st.State, st.Differences)
			}
			assertNothingLeft(t, db, before, "after rollback")
			rr, err = online.Rollback(ctx, conn, online.RollbackOptions{})
			if err != nil || rr.Outcome != "nothing_to_do" {
				t.Fatalf("second rollback: %v %+v", err, rr)
			}
			rep, err := online.Upgrade(ctx, conn, online.Options{})
			if err != nil || rep.Outcome != outcome.Applied {
				t.Fatalf("apply --online after the rollback: %v %+v", err, rep)
			}
			checkUpgraded(t, db, before)
			if _, err := online.Rollback(ctx, conn, online.RollbackOptions{}); !errors.Is(err, online.ErrAlreadySwitched) {
				t.Fatalf("rollback after the switch: %v", err)
			}
		})
	}
}

// The migration file, run by hand (psql -1) on an online-prepared database,
// finishes the upgrade too (its guard A1b accepts the prepared shape) and
// gives the same catalog; a half-made shape is refused, not rewritten.
func TestMigrationFileOnPreparedShape(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	stopOnlineAt(t, conn, online.PointSwitch)
	if s := mustShape(t, db); !s.Prepared() || s.Triggers != 2 {
		t.Fatalf("not prepared: %+v", s)
	}
	ms, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, ms[0].SQL); return err }); err != nil {
		t.Fatalf("the file on the prepared shape: %v", err)
	}
	want, err := upgrade.Want017()
	if err != nil {
		t.Fatal(err)
	}
	sameCatalog(t, "the file run by hand on the prepared shape", want, readCatalog(t, db.Pool))

	// A column that is there without the rest is refused, not rewritten.
	db2 := testdb.Inflight(t, 400)
	if _, err := db2.Pool.Exec(ctx, `alter table pgflow.step_tasks add column queue_name text`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db2.Pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, ms[0].SQL); return err })
	if err == nil || !strings.Contains(err.Error(), "not the online-prepared 0.16.0") {
		t.Fatalf("file on a half-made shape: %v", err)
	}
	// Prepared but one index invalid (a killed CONCURRENTLY build): refused.
	db3 := testdb.Inflight(t, 400)
	stopOnlineAt(t, testdb.Connect(t, db3.DSN), online.PointSwitch)
	if _, err := db3.Pool.Exec(ctx, `update pg_index set indisvalid = false where indexrelid = 'pgflow.idx_steps_normalized_slug'::regclass`); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, db3.Pool, func(tx pgx.Tx) error { _, err := tx.Exec(ctx, ms[0].SQL); return err })
	if err == nil || !strings.Contains(err.Error(), "idx_steps_normalized_slug") {
		t.Fatalf("file with an invalid prepared index: %v", err)
	}
}

// An online upgrade stopped at each point continues to a correct upgraded
// database when apply --online runs again (no rollback in between).
func TestResumeOnlineFromEveryPoint(t *testing.T) {
	testdb.SkipIfShort(t, "An online upgrade stopped at each point continues to a correct upgraded database when...")
	for _, stopAt := range allPoints {
		t.Run(stopAt, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Inflight(t, 400)
			before := db.Fingerprint(t)
			conn := testdb.Connect(t, db.DSN)
			stopOnlineAt(t, conn, stopAt)
			shape := mustShape(t, db)
			switch stopAt {
			case online.PointValidate:
				if shape.Checks != 4 || shape.ChecksValid != 0 {
					t.Fatalf("stopped before VALIDATE, want the four checks there and none validated: %+v", shape)
				}
			case online.PointIndex:
				if len(shape.IndexesValid) != 1 {
					t.Fatalf("stopped before the second index, want one valid index: %+v", shape)
				}
			case online.PointSwitch:
				if !shape.Prepared() {
					t.Fatalf("stopped before the switch, want the prepared shape: %+v", shape)
				}
			}
			info, err := online.ReadStatus(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if stopAt != online.PointPreflight && stopAt != online.PointExpand && (!info.InProgress() || info.Next != online.ContinueCommand) {
				t.Fatalf("status after stopping at %s: %+v", stopAt, info)
			}
			rep := applyOnline(t, conn, fmt.Sprintf("rerun after stopping at %s (shape %+v)", stopAt, shape))
			if stopAt != online.PointExpand && stopAt != online.PointPreflight && !rep.Report.Resumed {
				t.Fatalf("rerun after %s does not say it resumed", stopAt)
			}
			checkUpgraded(t, db, before)
		})
	}
}

// A constraint that has a check's name but not its definition is refused
// with a message naming it, not retried into "already exists".
func TestOnlineRefusesForeignCheck(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	stopOnlineAt(t, conn, online.PointCheck)
	if _, err := db.Pool.Exec(ctx, `alter table pgflow.step_tasks add constraint `+online.OnlineCheck+` check (queue_name <> '') not valid`); err != nil {
		t.Fatal(err)
	}
	if s := mustShape(t, db); !s.CheckForeign {
		t.Fatalf("shape %+v: want CheckForeign", s)
	}
	rep, err := online.Upgrade(ctx, conn, online.Options{})
	if !errors.Is(err, online.ErrRefused) || rep.Outcome != outcome.Refused || !strings.Contains(err.Error(), online.OnlineCheck) {
		t.Fatalf("want a refusal naming %s: %v (%s)", online.OnlineCheck, err, rep.Outcome)
	}
}

// A unique index build that meets duplicates (two flows differing only by
// case, written after the preflight) drops its invalid index, refuses with
// the audit check's findings and rolls the online upgrade back.
func TestOnlineIndexDuplicatesRefused(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	rep, err := online.Upgrade(ctx, conn, online.Options{Hooks: online.Hooks{At: func(ctx context.Context, _ uint32, p string) error {
		if p != online.PointIndex {
			return nil
		}
		_, err := db.Pool.Exec(ctx, `insert into pgflow.flows (flow_slug) values ('ROOT_MAP') on conflict do nothing`)
		return err
	}}})
	if !errors.Is(err, online.ErrDuplicate) || rep.Outcome != outcome.Refused || !strings.Contains(err.Error(), "flows.case_alias") {
		t.Fatalf("want a refusal naming flows.case_alias: %v (%s)", err, rep.Outcome)
	}
	if s := mustShape(t, db); s.Started() {
		t.Fatalf("the online upgrade was not rolled back after the refused build: %+v", s)
	}
	if len(rep.Report.Blockers) == 0 || rep.Report.Blockers[0].CheckID != "flows.case_alias" {
		t.Fatalf("want the findings of flows.case_alias as blockers: %+v", rep.Report.Blockers)
	}
	// The alias removed, a rerun finishes.
	if _, err := db.Pool.Exec(ctx, `delete from pgflow.flows where flow_slug = 'ROOT_MAP'`); err != nil {
		t.Fatal(err)
	}
	if rep, err := online.Upgrade(ctx, conn, online.Options{}); err != nil || rep.Outcome != outcome.Applied {
		t.Fatalf("rerun: %v %+v", err, rep)
	}
	checkUpgraded(t, db, nil)
}

// The switch on the prepared shape rewrites nothing: step_tasks keeps its
// relfilenode (no table rewrite, SET NOT NULL proven by the validated check)
// and the three unique indexes built concurrently are the ones the end
// state has (same oids: reused, not rebuilt under the locks).
func TestSwitchReusesPreparedShape(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	stopOnlineAt(t, conn, online.PointSwitch)
	const q = `select (select relfilenode::text from pg_class where oid = 'pgflow.step_tasks'::regclass) || ' ' ||
		string_agg(to_regclass('pgflow.' || n)::oid::text, ' ' order by n)
		from unnest(array['idx_flows_normalized_slug', 'idx_steps_normalized_slug', 'idx_step_tasks_queue_message']) n`
	var before, after string
	if err := db.Pool.QueryRow(ctx, q).Scan(&before); err != nil {
		t.Fatal(err)
	}
	rep, err := online.Upgrade(ctx, conn, online.Options{})
	if err != nil || rep.Outcome != outcome.Applied {
		t.Fatalf("switch: %v %+v", err, rep)
	}
	if err := db.Pool.QueryRow(ctx, q).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Fatalf("the switch rewrote step_tasks or rebuilt an index: relfilenode and index oids %s before, %s after", before, after)
	}
	checkUpgraded(t, db, nil)
}
