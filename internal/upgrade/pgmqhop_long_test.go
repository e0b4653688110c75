package upgrade_test

import (
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Issue 37's case end to end, on a database built from upstream's own
// 0.16.0 files with upstream's example flow and work in flight: the audit
// says the plain pgmq update would fail and why; apply --pgmq 1.13.1 with
// the user's copy of upstream's files takes pgflow to upstream's newest
// release and pgmq to 1.13.1 in one transaction, every pgflow row and every
// message kept; the package worker then drains every run in flight.
func TestLongApplyPGMQOnUpstream016(t *testing.T) {
	testdb.SkipUnlessLong(t, "apply --pgmq 1.13.1 on upstream's own 0.16.0 with analyzeWebsite and work in flight: newest pgflow, pgmq 1.13.1, rows and messages kept, drained")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	ctx := testCtx(t)
	db := upstreamInflight(t, "0.16.0").AnalyzeWebsite(t,
		`select pgflow.start_flow('analyzeWebsite', '{"url": "https://example.com"}')`,
		`select pgflow.start_flow('analyzeWebsite', '{"url": "https://example.org"}')`)

	rep, err := audit.Run(ctx, testdb.Connect(t, db.DSN), audit.Options{Checks: []string{"pgmq.update_path", "backup.pgdump_pgmq"}})
	if err != nil {
		t.Fatal(err)
	}
	var said string
	for _, r := range rep.Checks {
		for _, f := range r.Findings {
			if f.CheckID == "pgmq.update_path" && f.Severity == audit.Warning {
				said = f.Message
			}
		}
	}
	if !strings.Contains(said, "would fail") || !strings.Contains(said, `pgmq."q_analyzeWebsite"`) {
		t.Fatalf("the audit does not say the update would fail: %+v", rep.Checks)
	}
	t.Logf("audit: %s", said)

	opts := fastOpts()
	opts.PGMQ = testdb.PGMQNewest
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	applyPGMQ(ctx, t, db, opts, func(res *outcome.Result[*upgrade.Report]) {
		if res.Report.VersionNow != versions.Newest || db.PGMQVersion(t) != testdb.PGMQNewest {
			t.Fatalf("pgflow %s, pgmq %s", res.Report.VersionNow, db.PGMQVersion(t))
		}
	})
	drainAnalyzeWebsite(ctx, t, db)
}

// The two orders of the hops, measured (docs/runbook.md, "The pgmq hop"):
// A, apply --pgmq (pgflow's hop, then pgmq's, one transaction); B, pgmq
// first (the same repair and update by hand, committed), then apply. It
// logs each order's lock windows, and shows what B's window between the
// hops does to pgflow 0.16.0: its delete_flow_and_data drops the queue
// under the listed spelling and leaves the renamed row behind (rolled back
// here), which 0.17.0 resolves case-insensitively and A never exposes.
func TestLongPGMQHopOrder(t *testing.T) {
	testdb.SkipUnlessLong(t, "the pgflow and pgmq hops in both orders: lock windows measured, the 0.16.0 window of pgmq-first shown")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	const reps = 3
	var a, bPGMQ, bPgflow []time.Duration
	for i := 0; i < reps; i++ {
		ctx := testCtx(t)
		db := pgmqDB(t)
		if _, err := db.Pool.Exec(ctx, `select count(*) from generate_series(1, 2000) g, lateral pgflow.start_flow('analyzeWebsite', jsonb_build_object('url', 'https://example.com/' || g))`); err != nil {
			t.Fatal(err)
		}
		second := db.Clone(t)

		opts := fastOpts()
		opts.PGMQ = testdb.PGMQNewest
		res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
		if err != nil {
			t.Fatalf("A: %v", err)
		}
		a = append(a, time.Duration(res.Report.LockWindowMS)*time.Millisecond)

		// B: the pgmq hop by hand first, on pgflow 0.16.0.
		conn := testdb.Connect(t, second.DSN)
		start := time.Now()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{
			`lock table pgmq.meta in exclusive mode`,
			`update pgmq.meta set queue_name = lower(queue_name) where queue_name <> lower(queue_name)`,
			`alter extension pgmq update to '` + testdb.PGMQNewest + `'`,
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				t.Fatalf("B, pgmq first: %s: %v", s, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		bPGMQ = append(bPGMQ, time.Since(start))
		if i == 0 {
			// Between B's hops: pgflow 0.16.0 on a renamed queue.
			tx, err := second.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `select pgflow.delete_flow_and_data('analyzeWebsite')`); err != nil {
				t.Fatalf("0.16.0's delete_flow_and_data between B's hops: %v", err)
			}
			var left []string
			if err := tx.QueryRow(ctx, `select coalesce(array_agg(queue_name::text), '{}') from pgmq.meta where lower(queue_name) = 'analyzewebsite'`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback(ctx)
			if len(left) != 1 {
				t.Fatalf("between B's hops 0.16.0's delete_flow_and_data left %v listed", left)
			}
			t.Logf("B, between the hops: pgflow 0.16.0's delete_flow_and_data('analyzeWebsite') drops the tables but leaves pgmq.meta row %v (a listed queue without tables; rolled back here)", left)
		}
		res, err = upgrade.Apply(ctx, conn, fastOpts())
		if err != nil {
			t.Fatalf("B, then pgflow: %v", err)
		}
		bPgflow = append(bPgflow, time.Duration(res.Report.LockWindowMS)*time.Millisecond)
	}
	t.Logf("2000 analyzeWebsite runs + the in-flight state, %d repetitions on this machine:", reps)
	t.Logf("A apply --pgmq (one transaction): lock windows %v", a)
	t.Logf("B pgmq first: pgmq transaction %v, then apply %v", bPGMQ, bPgflow)
}
