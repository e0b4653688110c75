package quiesce_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

const flow = "qflow"

var def = oldworker.Flow{
	Slug:    flow,
	Options: oldworker.Options{MaxAttempts: oldworker.Int(3), BaseDelay: oldworker.Int(0), Timeout: oldworker.Int(30)},
	Steps:   []oldworker.Step{{Slug: "a"}, {Slug: "b", DependsOn: []string{"a"}}},
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// scene is a real 0.16.0 database with live simulated 0.16.0 workers (two
// http, one process) working through runs, worker functions in both start
// modes (one disabled), upstream's three cron jobs (one inactive), a
// pruning job, a job that is not pgflow's and a pgflow job pg_cron runs in
// another database.
type scene struct {
	db       *testdb.DB
	workers  []*oldworker.Worker
	errs     []error
	mu       sync.Mutex
	wg       sync.WaitGroup
	cancel   context.CancelFunc
	handled  atomic.Int64
	released chan struct{} // closed: handlers return (nil: they never block)
}

func newScene(t *testing.T, block bool) *scene {
	t.Helper()
	s := &scene{db: testdb.Baseline(t)}
	if block {
		s.released = make(chan struct{})
	}
	s.db.Exec(t,
		`insert into pgflow.worker_functions (function_name, enabled, start_mode) values ('idle-fn', false, 'http'), ('spare-fn', true, 'process')`,
		`select cron.alter_job(job_id => (select jobid from cron.job where jobname = 'pgflow_cleanup_logs'), active => false)`,
		// In this database, as pg_cron records a job scheduled from the
		// database it runs in.
		`select cron.schedule_in_database('my_prune', '0 3 * * *', 'select pgflow.prune_data_older_than(make_interval(days => 7))', current_database())`,
		`select cron.schedule_in_database('not_pgflow', '* * * * *', 'select 1', current_database())`,
		// Another database's pgflow job, kept in the one cron.job: not ours.
		`select cron.schedule_in_database('other_db_requeue', '*/5 * * * *', 'select pgflow.requeue_stalled_tasks()', 'postgres')`,
	)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for i, mode := range []string{"http", "http", "process"} {
		fn := flow + "-" + mode
		w := oldworker.New(s.db.Pool, oldworker.Config{
			FlowSlug: flow, Shape: def.MustShape(), FunctionName: fn, StartMode: mode,
			Handlers: map[string]oldworker.Handler{
				"a": s.handler, "b": s.handler,
			},
			BatchSize: 3, VisibilityTimeout: 30, MaxPollSeconds: 1, PollIntervalMs: 20,
			HeartbeatInterval: 50 * time.Millisecond, Logger: quiet,
		})
		if err := w.Start(ctx); err != nil {
			t.Fatalf("starting worker %d: %v", i, err)
		}
		s.workers = append(s.workers, w)
	}
	s.db.Exec(t, fmt.Sprintf(`select count(*) from (select pgflow.start_flow('%s', jsonb_build_object('i', g)) from generate_series(1, 12) g) x`, flow))
	for _, w := range s.workers {
		s.wg.Add(1)
		go func(w *oldworker.Worker) {
			defer s.wg.Done()
			if err := w.Run(ctx); err != nil {
				s.mu.Lock()
				s.errs = append(s.errs, err)
				s.mu.Unlock()
			}
		}(w)
	}
	t.Cleanup(func() {
		if s.released != nil {
			select {
			case <-s.released:
			default:
				close(s.released)
			}
		}
		s.stop()
	})
	// Work in flight before the quiesce starts.
	deadline := time.Now().Add(20 * time.Second)
	for s.handled.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s.handled.Load() < 2 {
		t.Fatal("the 0.16.0 workers handled nothing in 20 s")
	}
	return s
}

func (s *scene) handler(ctx context.Context, task oldworker.Task) (any, error) {
	s.handled.Add(1)
	if s.released != nil {
		<-s.released
	} else {
		time.Sleep(30 * time.Millisecond)
	}
	return map[string]int{"ok": 1}, nil
}

// stop ends the workers still running and waits for them.
func (s *scene) stop() {
	s.cancel()
	s.wg.Wait()
}

// values is every value a quiesce may touch and must give back: each
// worker function's enabled, each cron job's active flag (pgflow's and the
// unrelated one).
type values struct {
	Functions map[string]bool
	Jobs      map[string]bool
}

func snapshot(t *testing.T, db *testdb.DB) values {
	t.Helper()
	ctx := context.Background()
	v := values{Functions: map[string]bool{}, Jobs: map[string]bool{}}
	rows, _ := db.Pool.Query(ctx, `select function_name, enabled from pgflow.worker_functions`)
	var name string
	var b bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &b}, func() error { v.Functions[name] = b; return nil }); err != nil {
		t.Fatal(err)
	}
	var cron bool
	if err := db.Pool.QueryRow(ctx, `select to_regclass('cron.job') is not null`).Scan(&cron); err != nil {
		t.Fatal(err)
	}
	if cron {
		rows, _ = db.Pool.Query(ctx, `select jobid || ' ' || jobname, active from cron.job`)
		if _, err := pgx.ForEachRow(rows, []any{&name, &b}, func() error { v.Jobs[name] = b; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func sameValues(t *testing.T, before, after values, when string) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("%s: recorded values not given back:\nbefore %v\nafter  %v", when, before, after)
	}
}

func state(t *testing.T, conn *pgx.Conn) versions.SchemaState {
	t.Helper()
	st, err := versions.DetectSchema(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

func recorded(t *testing.T, conn *pgx.Conn) *quiesce.State {
	t.Helper()
	s, err := quiesce.Load(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// nothingLost: no task is left started, every queued task still has its
// message, and every run is there.
func nothingLost(t *testing.T, db *testdb.DB) {
	t.Helper()
	var started, orphan, runs int
	err := db.Pool.QueryRow(context.Background(), `
		select (select count(*) from pgflow.step_tasks where status = 'started'),
		       (select count(*) from pgflow.step_tasks t where t.status = 'queued'
		          and not exists (select 1 from pgmq.q_qflow q where q.msg_id = t.message_id)),
		       (select count(*) from pgflow.runs)`).Scan(&started, &orphan, &runs)
	if err != nil {
		t.Fatal(err)
	}
	if started != 0 || orphan != 0 || runs != 12 {
		t.Fatalf("after the quiesced upgrade: %d task(s) started, %d queued without their message, %d runs (want 0, 0, 12)", started, orphan, runs)
	}
}

// workersStoppedCleanly: every 0.16.0 worker saw its deprecation and
// stopped without a protocol error (none called the 0.17.0 schema).
func (s *scene) workersStoppedCleanly(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the deprecated 0.16.0 workers did not stop")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.errs) > 0 {
		t.Fatalf("0.16.0 workers failed (one claimed against the new schema?): %v", s.errs)
	}
	for _, w := range s.workers {
		if !w.Deprecated() {
			t.Fatalf("worker %s stopped without seeing its deprecation", w.ID())
		}
	}
}

func quiesceOpts() *quiesce.Options {
	return &quiesce.Options{DrainTimeout: 30 * time.Second, Poll: 50 * time.Millisecond}
}
