package queueroutes_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/queueroutes"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// imgFlow is a step-mode flow: fetch → resize, each step on its own queue.
var imgFlow = worker.Flow{Slug: "img", QueueMode: worker.QueueModeStep, Steps: []worker.Step{
	{Slug: "fetch"}, {Slug: "resize", DependsOn: []string{"fetch"}},
}}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func handlers() map[string]worker.HandlerFunc {
	h := func(context.Context, *worker.Task) (any, error) { return map[string]bool{"ok": true}, nil }
	return map[string]worker.HandlerFunc{"fetch": h, "resize": h}
}

// startWorker starts a worker of imgFlow's step (stopped at cleanup).
func startWorker(t *testing.T, db *testdb.DB, step, function string) *worker.Worker {
	t.Helper()
	w, err := worker.New(db.Pool, worker.Config{Flow: imgFlow, StepSlug: step, Handlers: handlers(), FunctionName: function,
		MaxPollSeconds: 1, HeartbeatInterval: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return w
}

func read(t *testing.T, dsn string, opts queueroutes.Options) *queueroutes.Report {
	t.Helper()
	rep, err := queueroutes.Read(context.Background(), testdb.Connect(t, dsn), opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func route(t *testing.T, rep *queueroutes.Report, flow, step string) queueroutes.Route {
	t.Helper()
	for _, r := range rep.Routes {
		if r.Flow == flow && r.Step == step {
			return r
		}
	}
	t.Fatalf("no route %s/%q in %+v", flow, step, rep.Routes)
	return queueroutes.Route{}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStepRouteWithoutWorker: a step-mode flow whose second step has no
// worker: its message waits and the route fails, naming flow, step, queue,
// count and what to deploy; once that step's worker runs, nothing fails.
// The flow-mode flow migrated from 0.16.0 is one route for all its steps.
func TestStepRouteWithoutWorker(t *testing.T) {
	db := testdb.Baseline(t)
	testdb.Exec(t, db.Pool, `select pgflow.create_flow('legacy')`)
	testdb.Exec(t, db.Pool, `select pgflow.add_step('legacy', 'a')`)
	testdb.Exec(t, db.Pool, `select pgflow.add_step('legacy', 'b', array['a'])`)
	testdb.Migrate(t, db.Pool) // as upstream's own migration would: no record of ours

	fetch := startWorker(t, db, "fetch", "fetch-fn")
	testdb.Exec(t, db.Pool, `select pgflow.start_flow('img', '{}'::jsonb)`)
	// fetch completes; resize's message is sent to img__resize and waits.
	waitFor(t, "resize's message", func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(), `select count(*) from pgmq.q_img__resize`).Scan(&n)
		return n == 1
	})
	_ = fetch

	opts := queueroutes.Options{Grace: 200 * time.Millisecond}
	time.Sleep(300 * time.Millisecond)
	rep := read(t, db.DSN, opts)
	if len(rep.Routes) != 3 {
		t.Fatalf("routes: %+v", rep.Routes)
	}
	lg := route(t, rep, "legacy", "")
	if lg.QueueMode != queueroutes.ModeFlow || lg.Queue != "legacy" || lg.StepLabel() != "all steps" || lg.State != queueroutes.StateIdle || !lg.QueueExists {
		t.Fatalf("flow-mode route: %+v", lg)
	}
	f := route(t, rep, "img", "fetch")
	if f.Queue != "img__fetch" || f.State != queueroutes.StateOK || len(f.Workers) != 1 || f.Workers[0].FunctionName != "fetch-fn" || f.Workers[0].Legacy {
		t.Fatalf("fetch route: %+v", f)
	}
	r := route(t, rep, "img", "resize")
	if r.Queue != "img__resize" || r.State != queueroutes.StateNoWorker || r.Visible != 1 || r.Hidden != 0 || r.Waiting != 1 ||
		r.WaitingSince == nil || r.OldestEnqueuedAt == nil || r.OldestAge(rep.ReadAt) < 200*time.Millisecond {
		t.Fatalf("resize route: %+v", r)
	}
	if len(rep.Findings) != 1 {
		t.Fatalf("findings: %+v", rep.Findings)
	}
	got := rep.Findings[0]
	for _, want := range []string{"flow img", "step resize", "queue img__resize", "1 message(s) waiting since", "no live worker"} {
		if !strings.Contains(got.Message, want) {
			t.Errorf("finding %q lacks %q", got.Message, want)
		}
	}
	if !strings.Contains(got.Deploy, "step resize of flow img") || got.Waiting != 1 || got.Step != "resize" {
		t.Errorf("finding: %+v", got)
	}
	if rep.UpgradedAt != nil {
		t.Errorf("upgraded by a migration runner, yet a record of ours: %v", rep.UpgradedAt)
	}

	// Within the grace period nothing fails: the message is younger.
	if rep := read(t, db.DSN, queueroutes.Options{Grace: time.Hour}); len(rep.Findings) != 0 || route(t, rep, "img", "resize").State != queueroutes.StateIdle {
		t.Fatalf("within the grace period: %+v", rep.Findings)
	}

	startWorker(t, db, "resize", "resize-fn")
	waitFor(t, "the run to complete", func() bool {
		var s string
		_ = db.Pool.QueryRow(context.Background(), `select status from pgflow.runs where flow_slug = 'img'`).Scan(&s)
		return s == "completed"
	})
	rep = read(t, db.DSN, opts)
	if len(rep.Findings) != 0 {
		t.Fatalf("findings with both workers: %+v", rep.Findings)
	}
	if r := route(t, rep, "img", "resize"); r.State != queueroutes.StateOK || r.Visible+r.Hidden != 0 || r.Workers[0].FunctionName != "resize-fn" {
		t.Fatalf("resize route: %+v", r)
	}
}

// TestLegacyWorkers: a 0.16.0 worker registered before this tool's upgrade
// and still heartbeating makes its route fail even with no message waiting;
// a worker recording an old pgflow_version is one too; beside a 0.17 worker
// it is counted, not failed. A stopped or silent worker is not live.
func TestLegacyWorkers(t *testing.T) {
	db := testdb.Baseline(t)
	testdb.Exec(t, db.Pool, `select pgflow.create_flow('legacy')`)
	testdb.Exec(t, db.Pool, `select pgflow.add_step('legacy', 'a')`)
	testdb.Exec(t, db.Pool, `insert into pgflow.workers (queue_name, worker_id, function_name, started_at, last_heartbeat_at)
		values ('legacy', gen_random_uuid(), 'old-fn', now() - interval '1 hour', now() - interval '1 hour')`)
	testdb.Migrate(t, db.Pool, `
		create schema pgflow_upgrade;
		create table pgflow_upgrade.schema_revisions (version text primary key, name text not null, applied_at timestamptz not null default now());
		insert into pgflow_upgrade.schema_revisions (version, name) values ('20261203100000', 'pgflow_private_step_queues')`)
	// Still heartbeating after the upgrade; one more that stopped, one silent.
	testdb.Exec(t, db.Pool, `update pgflow.workers set last_heartbeat_at = now()`)
	testdb.Exec(t, db.Pool, `insert into pgflow.workers (queue_name, worker_id, function_name, stopped_at) values ('legacy', gen_random_uuid(), 'stopped-fn', now())`)
	testdb.Exec(t, db.Pool, `insert into pgflow.workers (queue_name, worker_id, function_name, last_heartbeat_at) values ('legacy', gen_random_uuid(), 'silent-fn', now() - interval '10 minutes')`)

	rep := read(t, db.DSN, queueroutes.Options{})
	if rep.UpgradedAt == nil {
		t.Fatal("the record of the upgrade was not read")
	}
	r := route(t, rep, "legacy", "")
	if r.State != queueroutes.StateLegacyOnly || len(r.Workers) != 1 || !r.Workers[0].Legacy || r.Workers[0].Label() != "old-fn (0.16.0)" ||
		!strings.Contains(r.Workers[0].LegacyReason, "before the 0.17 migration") {
		t.Fatalf("route: %+v", r)
	}
	if len(rep.Findings) != 1 || !strings.Contains(rep.Findings[0].Message, "only 0.16.0 worker(s) (old-fn)") ||
		!strings.Contains(rep.Findings[0].Deploy, "stop the 0.16.0 worker(s)") {
		t.Fatalf("findings: %+v", rep.Findings)
	}

	// A 0.17.1+ database records versions: an old one is a 0.16.0 worker
	// whenever it started.
	testdb.Exec(t, db.Pool, `alter table pgflow.workers add column pgflow_version text`)
	testdb.Exec(t, db.Pool, `update pgflow.workers set started_at = now(), pgflow_version = '0.16.0' where function_name = 'old-fn'`)
	rep = read(t, db.DSN, queueroutes.Options{})
	if r := route(t, rep, "legacy", ""); !rep.VersionsRecorded || r.State != queueroutes.StateLegacyOnly || !strings.Contains(r.Workers[0].LegacyReason, "records pgflow 0.16.0") {
		t.Fatalf("route: %+v", r)
	}
	testdb.Exec(t, db.Pool, `insert into pgflow.workers (queue_name, worker_id, function_name, pgflow_version) values ('legacy', gen_random_uuid(), 'new-fn', '0.17.1')`)
	rep = read(t, db.DSN, queueroutes.Options{})
	if r := route(t, rep, "legacy", ""); r.State != queueroutes.StateOK || len(rep.Findings) != 0 || rep.LegacyBeside != 1 || len(r.Workers) != 2 {
		t.Fatalf("route: %+v, findings %+v, legacy beside %d", r, rep.Findings, rep.LegacyBeside)
	}
}

// TestReadOnlyRoleAndUnreadableQueue: a role with USAGE and SELECT on pgflow
// and pgmq reads every route; a queue table created after its grant is
// unknown, not a failure; no grant at all is an error that keeps its SQLSTATE.
func TestReadOnlyRoleAndUnreadableQueue(t *testing.T) {
	db := testdb.Baseline(t)
	testdb.Exec(t, db.Pool, `select pgflow.create_flow('legacy')`)
	testdb.Exec(t, db.Pool, `select pgflow.add_step('legacy', 'a')`)
	testdb.Migrate(t, db.Pool)
	role, roDSN := db.LoginRole(t, "routes_ro", "")
	ident := pgx.Identifier{role}.Sanitize()

	if _, err := queueroutes.Read(context.Background(), testdb.Connect(t, roDSN), queueroutes.Options{}); !queueroutes.Inconclusive(err) || sqlstate(err) != "42501" {
		t.Fatalf("without grants: %v (SQLSTATE %q), want an inconclusive 42501", err, sqlstate(err))
	}
	testdb.Exec(t, db.Pool, `grant usage on schema pgflow, pgmq to `+ident)
	testdb.Exec(t, db.Pool, `grant select on all tables in schema pgflow, pgmq to `+ident)
	startWorker(t, db, "fetch", "fetch-fn") // creates img's queues after the grant
	rep := read(t, roDSN, queueroutes.Options{})
	if r := route(t, rep, "legacy", ""); r.State != queueroutes.StateIdle || r.Error != "" {
		t.Fatalf("legacy route: %+v", r)
	}
	// fetch has a live worker: its depth does not matter; resize's does.
	if r := route(t, rep, "img", "fetch"); r.State != queueroutes.StateOK || r.Error == "" {
		t.Fatalf("fetch route: %+v", r)
	}
	if r := route(t, rep, "img", "resize"); r.State != queueroutes.StateUnknown || !strings.Contains(r.Error, "42501") || rep.Unknown != 1 {
		t.Fatalf("resize route: %+v (unknown %d)", r, rep.Unknown)
	}
}

// TestNotUpgraded: a 0.16.0 database has no routes.
func TestNotUpgraded(t *testing.T) {
	db := testdb.Baseline(t)
	if _, err := queueroutes.Read(context.Background(), testdb.Connect(t, db.DSN), queueroutes.Options{}); !errors.Is(err, queueroutes.ErrNoRoutes) {
		t.Fatalf("got %v, want ErrNoRoutes", err)
	}
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// recorder is a pgx tracer that keeps every statement a connection sends.
type recorder struct{ sql []string }

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.sql = append(r.sql, d.SQL)
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestReadSendsOnlySelectsInAReadOnlyTransaction: every statement Read sends
// (a routes read with queues, workers and the upgrade's record) is a SELECT
// inside one BEGIN ... READ ONLY transaction that is rolled back; the
// database is unchanged.
func TestReadSendsOnlySelectsInAReadOnlyTransaction(t *testing.T) {
	db := testdb.Baseline(t)
	testdb.Exec(t, db.Pool, `select pgflow.create_flow('legacy')`)
	testdb.Exec(t, db.Pool, `select pgflow.add_step('legacy', 'a')`)
	testdb.Exec(t, db.Pool, `select pgflow.start_flow('legacy', '{}'::jsonb)`)
	testdb.Migrate(t, db.Pool, `
		create schema pgflow_upgrade;
		create table pgflow_upgrade.schema_revisions (version text primary key, name text not null, applied_at timestamptz not null default now());
		insert into pgflow_upgrade.schema_revisions (version, name) values ('20261203100000', 'pgflow_private_step_queues')`)
	// Compiles img (its queues); stopped so that no heartbeat changes
	// pgflow.workers while the state is compared.
	if err := startWorker(t, db, "fetch", "fetch-fn").Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := testdb.State(t, db.Pool)

	rec := &recorder{}
	conn, err := session.OpenWith(context.Background(), db.DSN, session.Options{Purpose: session.Test, Tracer: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rep, err := queueroutes.Read(context.Background(), conn, queueroutes.Options{Grace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Routes) != 3 || rep.UpgradedAt == nil || len(rep.Findings) != 1 {
		t.Fatalf("the read did not read everything: %+v", rep)
	}
	if len(rec.sql) < 8 {
		t.Fatalf("only %d statements traced: %q", len(rec.sql), rec.sql)
	}
	first, last := strings.ToLower(rec.sql[0]), strings.ToLower(rec.sql[len(rec.sql)-1])
	if !strings.HasPrefix(first, "begin") || !strings.Contains(first, "read only") || last != "rollback" {
		t.Fatalf("not one read-only transaction rolled back: first %q, last %q", first, last)
	}
	for _, s := range rec.sql[1 : len(rec.sql)-1] {
		if !strings.HasPrefix(strings.ToLower(strings.TrimSpace(s)), "select") {
			t.Errorf("a statement that is not a SELECT: %q", s)
		}
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "queueroutes.Read")
}
