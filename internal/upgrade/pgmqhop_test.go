package upgrade_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// pgmqDB is testdb.Inflight (whose Legacy_Flow is mixed case) with upstream's
// example flow analyzeWebsite defined through pgflow's own functions and
// one run of it in flight (website claimed by a 0.16.0 worker): two queues
// whose pgmq.meta names do not match their tables.
func pgmqDB(t *testing.T) *testdb.DB {
	t.Helper()
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	return testdb.Inflight(t, 3).AnalyzeWebsite(t,
		`select pgflow.start_flow('analyzeWebsite', '{"url": "https://example.com"}', '00000000-0000-0000-0000-0000000000a1')`,
		`select pgflow.start_flow('analyzeWebsite', '{"url": "https://example.org"}', '00000000-0000-0000-0000-0000000000a2')`,
		`select count(*) from pgflow.start_tasks('analyzeWebsite', array(select msg_id from pgmq.read('analyzeWebsite', 30, 1)), '00000000-0000-0000-0000-0000000000aa')`)
}

// applyPGMQ runs apply with opts (--pgmq) on db and fails t unless it
// applied with every pgflow row kept (the new columns are the pgflow
// hop's) and every message where it was; check looks at the result before
// the rows are compared.
func applyPGMQ(ctx context.Context, t *testing.T, db *testdb.DB, opts upgrade.Options, check func(*outcome.Result[*upgrade.Report])) {
	t.Helper()
	before := db.Fingerprint(t)
	msgs := queueRows(t, db)
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("apply --pgmq: %s %v: %s", res.Outcome, err, res.Message)
	}
	t.Logf("%s", res.Message)
	check(res)
	after := db.Fingerprint(t)
	for _, d := range fingerprint.Compare(before, after) {
		if strings.HasPrefix(d.Table, "pgflow.") {
			t.Errorf("pgflow row changed: %s", d)
		}
	}
	if got := queueRows(t, db); !mapsEqual(msgs, got) {
		t.Fatalf("messages differ:\nbefore %v\nafter  %v", msgs, got)
	}
}

// drainAnalyzeWebsite drains every run in flight on db with the package
// worker (the queues are still pgflow's: every route resolves to one
// listed queue) and fails t unless every analyzeWebsite run completed.
func drainAnalyzeWebsite(ctx context.Context, t *testing.T, db *testdb.DB) *scenario.DrainReport {
	t.Helper()
	rep, err := scenario.Drain(ctx, &scenario.DB{Name: db.Name, DSN: db.DSN, Pool: db.Pool}, scenario.DrainOptions{FastForward: true})
	if err != nil {
		t.Fatalf("drain on pgmq %s: %v (%+v)", testdb.PGMQNewest, err, rep)
	}
	var open int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.runs where flow_slug = 'analyzeWebsite' and status <> 'completed'`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("analyzeWebsite runs not completed: %d (%v)", open, err)
	}
	t.Logf("drained on pgmq %s: %+v", testdb.PGMQNewest, rep)
	return rep
}

// queueRows is every message of every queue and archive, keyed by the
// queue's table, in pgmq 1.5.1's columns (1.10.0 adds last_read_at).
func queueRows(t *testing.T, db *testdb.DB) map[string][]string {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Pool.Query(ctx, `select c.relname::text from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		where n.nspname = 'pgmq' and c.relkind = 'r' and (c.relname like 'q\_%' or c.relname like 'a\_%') order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, tab := range tables {
		cols := "msg_id, read_ct, enqueued_at, vt, message, headers"
		if strings.HasPrefix(tab, "a_") {
			cols += ", archived_at"
		}
		rows, err := db.Pool.Query(ctx, "select ("+cols+")::text from "+pgx.Identifier{"pgmq", tab}.Sanitize()+" order by msg_id")
		if err != nil {
			t.Fatal(err)
		}
		out[tab], err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// apply --pgmq 1.13.1 on a real 0.16.0 with upstream's example flow, where
// the plain update fails: pgflow ends at 0.17.0 and pgmq at 1.13.1 in one
// transaction, every row and message kept, the mixed-case names made to
// match their tables, the claim path checked before and after the commit,
// and the package worker drains every run in flight.
func TestApplyPGMQOnMixedCaseQueues(t *testing.T) {
	ctx := testCtx(t)
	db := pgmqDB(t)
	opts := fastOpts()
	opts.PGMQ = testdb.PGMQNewest
	applyPGMQ(ctx, t, db, opts, func(res *outcome.Result[*upgrade.Report]) {
		p := res.Report.PGMQ
		if p == nil || p.From != "1.5.1" || p.To != testdb.PGMQNewest || p.Queues != 3 || p.ClaimChecked != 3 || p.ClaimCheckedAfter != 3 {
			t.Fatalf("pgmq report %+v", p)
		}
		var repaired []string
		for _, r := range p.Repairs {
			repaired = append(repaired, r.Queue)
		}
		if slices.Sort(repaired); !slices.Equal(repaired, []string{"Legacy_Flow", "analyzeWebsite"}) {
			t.Fatalf("repairs %+v", p.Repairs)
		}
		if want := []string{"pgmq.meta", "pgmq.a_analyzewebsite", "pgmq.a_legacy_flow", "pgmq.a_root_map", "pgmq.q_analyzewebsite", "pgmq.q_legacy_flow", "pgmq.q_root_map"}; !slices.Equal(p.Locked, want) {
			t.Fatalf("locked %v, want %v", p.Locked, want)
		}
		if v := db.PGMQVersion(t); v != testdb.PGMQNewest {
			t.Fatalf("pgmq %s after apply --pgmq", v)
		}
		if n := scalarOf[int](t, db, `select count(*) from pgmq.meta where queue_name <> lower(queue_name)`); n != 0 {
			t.Fatalf("%d mixed-case pgmq.meta names left", n)
		}
	})
	if rep := drainAnalyzeWebsite(ctx, t, db); rep.Completed == 0 {
		t.Fatalf("the drain completed nothing: %+v", rep)
	}
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// What apply --pgmq refuses, each before changing anything: a target that
// breaks the claim path, a version the server does not offer, a downgrade.
// A dry run repairs and updates, then rolls everything back.
func TestApplyPGMQRefusalsAndDryRun(t *testing.T) {
	ctx := testCtx(t)
	db := pgmqDB(t)
	metaBefore := scalarOf[[]string](t, db, `select array_agg(queue_name::text order by queue_name) from pgmq.meta`)
	for _, c := range []struct {
		target string
		want   error
		says   string
	}{
		{"1.10.1", upgrade.ErrPGMQTarget, "42804"},
		{"1.10.0", upgrade.ErrPGMQTarget, "1.11.0 or later"},
		{"1.99.0", upgrade.ErrPGMQScripts, "pgmq--1.5.1--"},
		{"1.4.0", upgrade.ErrPGMQTarget, "not downgraded"},
	} {
		opts := fastOpts()
		opts.PGMQ = c.target
		res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
		if !errors.Is(err, c.want) || res.Outcome != outcome.Refused || !strings.Contains(err.Error(), c.says) {
			t.Errorf("--pgmq %s: %s %v, want refused with %v saying %q", c.target, res.Outcome, err, c.want, c.says)
		}
	}
	opts := fastOpts()
	opts.PGMQ, opts.DryRun = testdb.PGMQNewest, true
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.DryRun || len(res.Report.PGMQ.Repairs) != 2 || res.Report.PGMQ.ClaimChecked != 3 {
		t.Fatalf("dry run: %s %v %+v", res.Outcome, err, res.Report.PGMQ)
	}
	if !strings.Contains(res.Message, "pgmq 1.5.1 → "+testdb.PGMQNewest) {
		t.Errorf("dry run message: %s", res.Message)
	}
	if v := db.PGMQVersion(t); v != "1.5.1" {
		t.Fatalf("a dry run left pgmq at %s", v)
	}
	if got := scalarOf[[]string](t, db, `select array_agg(queue_name::text order by queue_name) from pgmq.meta`); !slices.Equal(got, metaBefore) {
		t.Fatalf("a dry run changed pgmq.meta: %v, was %v", got, metaBefore)
	}
	if st := scalarOf[bool](t, db, `select exists (select 1 from pg_attribute where attrelid = 'pgflow.flows'::regclass and attname = 'queue_mode')`); st {
		t.Fatal("a dry run left pgflow upgraded")
	}
}

// On a database whose pgflow is 0.17 already, apply --pgmq is the pgmq hop
// alone: the pgflow tables are not locked, pgmq is updated, and a second
// run has nothing to do.
func TestApplyPGMQAlone(t *testing.T) {
	ctx := testCtx(t)
	db := pgmqDB(t)
	if res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts()); err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("the pgflow hop: %s %v", res.Outcome, err)
	}
	opts := fastOpts()
	opts.PGMQ = testdb.PGMQNewest
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("the pgmq hop alone: %s %v: %s", res.Outcome, err, res.Message)
	}
	for _, s := range res.Report.Steps {
		if s.Step == upgrade.StepMigrate || s.Step == upgrade.StepPreflight {
			t.Errorf("the pgmq hop alone ran %s", s.Step)
		}
		if s.Step == upgrade.StepTableLocks && strings.Contains(s.Detail, "pgflow.") {
			t.Errorf("the pgmq hop alone locks pgflow tables: %s", s.Detail)
		}
	}
	if v := db.PGMQVersion(t); v != testdb.PGMQNewest {
		t.Fatalf("pgmq %s", v)
	}
	res, err = upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.AlreadyApplied {
		t.Fatalf("a second run: %s %v: %s", res.Outcome, err, res.Message)
	}
}

// A worker's open transaction on one queue: the hop's locks give up within
// their bounds and retries (lock_busy, naming the queue table and the
// session), never waiting behind it while a worker on another queue waits
// behind the hop; that worker's read goes through. Nothing changed.
func TestApplyPGMQLocksAreBounded(t *testing.T) {
	ctx := testCtx(t)
	db := pgmqDB(t)
	if res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), fastOpts()); err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("the pgflow hop: %s %v", res.Outcome, err)
	}
	holder := testdb.Connect(t, db.DSN)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `select count(*) from pgmq.read('root_map', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		other := testdb.Connect(t, db.DSN)
		// Meanwhile a worker on another queue keeps reading, each read
		// bounded: it must never fail by waiting behind the hop.
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if _, err := other.Exec(ctx, `set lock_timeout = '2s'; select count(*) from pgmq.read('legacy_flow', 1, 0)`); err != nil {
				done <- err
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- nil
	}()
	opts := fastOpts()
	opts.PGMQ, opts.LockTimeout, opts.LockRetries = testdb.PGMQNewest, 200*time.Millisecond, 2
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	var tle *upgrade.TableLockError
	if res.Outcome != outcome.LockBusy || !errors.As(err, &tle) || tle.Table != "q_root_map" || len(tle.Blockers) == 0 {
		t.Fatalf("apply --pgmq behind a worker's transaction: %s %v", res.Outcome, err)
	}
	if !strings.Contains(err.Error(), "pgmq.q_root_map") {
		t.Errorf("the error does not name the table: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("a worker on another queue failed while the hop tried its locks: %v", err)
	}
	if v := db.PGMQVersion(t); v != "1.5.1" {
		t.Fatalf("pgmq %s after a refused hop", v)
	}
}

// Without a pgmq extension (pgmq installed from SQL, as the project's
// stand-in is: here the extension's catalog rows are removed, leaving its
// objects as a plain schema) there is no update to run: refused before any
// lock, saying so.
func TestApplyPGMQWithoutTheExtension(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Baseline(t)
	if _, err := db.Pool.Exec(ctx, `delete from pg_catalog.pg_depend where refobjid = (select oid from pg_catalog.pg_extension where extname = 'pgmq') and deptype = 'e';
		delete from pg_catalog.pg_extension where extname = 'pgmq'`); err != nil {
		t.Fatal(err)
	}
	opts := fastOpts()
	opts.PGMQ = testdb.PGMQNewest
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if !errors.Is(err, upgrade.ErrPGMQTarget) || res.Outcome != outcome.Refused || !strings.Contains(err.Error(), "not installed as an extension") {
		t.Fatalf("apply --pgmq without the extension: %s %v", res.Outcome, err)
	}
}
