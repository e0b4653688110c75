package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// Stop with work in flight, in upstream's order: the worker is marked
// stopped first, polling stops, handlers that finish within the soft timeout
// have their outcomes written; the ones still running after it are
// cancelled and get no call at all (they stay started, attempt used, for
// requeue_stalled_tasks); the rest of the run was never touched and another
// worker finishes it.
func TestGracefulShutdownWithWorkInFlight(t *testing.T) {
	testdb.SkipIfShort(t, "stop with work in flight, in upstream's order")
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	ev := newEvents()
	success := newCounter()

	var a *worker.Worker
	var nth atomic.Int32
	var markedFirst atomic.Int32
	started := make(chan int, 8)
	var err error
	a, err = worker.New(db.Pool, worker.Config{
		Flow: mapFlow("drain"), Concurrency: 4, BatchSize: 4, ShutdownTimeout: 2 * time.Second,
		Logger: testLogger(t), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(ctx context.Context, tk *worker.Task) (any, error) {
			n := nth.Add(1)
			started <- tk.TaskIndex
			if n <= 2 {
				// Finish once the stop has marked the worker stopped (it
				// does that before waiting for in-flight work).
				<-a.Stopping()
				for ctx.Err() == nil {
					var stopped bool
					err := db.Pool.QueryRow(ctx, `select stopped_at is not null from pgflow.workers where worker_id = $1::uuid`, a.ID()).Scan(&stopped)
					if err == nil && stopped {
						markedFirst.Add(1)
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				success.add(tk)
				return tk.TaskIndex, nil
			}
			<-ctx.Done()
			return nil, ctx.Err()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, db.Pool, "drain", indexes(8))
	for range 4 {
		recv(t, "four handlers to start", started)
	}
	// Only as many tasks as there are slots were claimed.
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'started'`); n != 4 {
		t.Fatalf("%d tasks started, want 4 (the free slots)", n)
	}

	if err := a.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if markedFirst.Load() != 2 {
		t.Errorf("%d of 2 finishing handlers saw the worker marked stopped before they returned", markedFirst.Load())
	}
	outcomes := map[worker.Outcome]int{}
	for len(ev.ch) > 0 {
		outcomes[(<-ev.ch).Outcome]++
	}
	if outcomes[worker.OutcomeCompleted] != 2 || outcomes[worker.OutcomeAbandoned] != 2 || len(outcomes) != 2 {
		t.Errorf("outcomes before Stop returned: %v, want 2 completed and 2 abandoned", outcomes)
	}
	if s := a.Stats(); s.Claimed != 4 || s.Completed != 2 || s.Abandoned != 2 || s.Failed != 0 || s.WriteErrors != 0 {
		t.Errorf("stats %+v", s)
	}
	completed := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks t join pgflow.workers w on w.worker_id = t.last_worker_id
		where t.status = 'completed' and t.attempts_count = 1 and t.completed_at >= w.stopped_at`)
	held := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'started' and attempts_count = 1 and last_worker_id = $1::uuid`, a.ID())
	untouched := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'queued' and attempts_count = 0`)
	if completed != 2 || held != 2 || untouched != 4 {
		t.Errorf("%d completed after the stop mark, %d left started, %d untouched; want 2, 2, 4", completed, held, untouched)
	}

	// Another worker takes the untouched ones: nothing done twice.
	b := start(t, db.Pool, worker.Config{Flow: mapFlow("drain"), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(_ context.Context, tk *worker.Task) (any, error) {
			success.add(tk)
			return tk.TaskIndex, nil
		}}})
	ev.waitUntil(t, "the untouched tasks to complete", func() bool {
		return queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'completed'`) == 6
	})
	stopNow(t, b)
	if s := b.Stats(); s.Completed != 4 {
		t.Errorf("worker B stats %+v, want 4 completed", s)
	}
	if s := runStatus(t, db.Pool, run); s != "started" {
		t.Errorf("run %s, want started (two tasks wait for requeue_stalled_tasks)", s)
	}
}

func TestStopWithExpiredContextCancelsHandlersAtOnce(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	started := make(chan struct{}, 2)
	w := start(t, db.Pool, worker.Config{Flow: mapFlow("impatient"), Concurrency: 2, ShutdownTimeout: time.Hour, OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(ctx context.Context, _ *worker.Task) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}}})
	startRun(t, db.Pool, "impatient", indexes(2))
	recv(t, "handler 1", started)
	recv(t, "handler 2", started)
	// A cancelled Stop context ends the hour-long soft phase at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := w.Stop(ctx)
	<-w.Done()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Stop: %v", err)
	}
	if s := w.Stats(); s.Abandoned != 2 || s.Failed != 0 {
		t.Errorf("stats %+v, want 2 abandoned", s)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'started' and attempts_count = 1`); n != 2 {
		t.Errorf("%d tasks left started, want 2 (no call for a cancelled handler)", n)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is not null`, w.ID()); n != 1 {
		t.Error("not marked stopped")
	}
}

// A hard stop (Start's context cancelled) is a crash: nothing is written for
// the running tasks and the worker is not marked stopped.
func TestKilledWorkerWritesNothing(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	started := make(chan struct{}, 3)
	killCtx, kill := context.WithCancel(context.Background())
	defer kill()
	a, err := worker.New(db.Pool, worker.Config{
		Flow: mapFlow("crash"), Concurrency: 3, Logger: testLogger(t),
		Handlers: map[string]worker.HandlerFunc{"work": func(ctx context.Context, _ *worker.Task) (any, error) {
			started <- struct{}{}
			<-ctx.Done() // never finishes on its own
			return nil, ctx.Err()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(killCtx); err != nil {
		t.Fatal(err)
	}
	startRun(t, db.Pool, "crash", indexes(3))
	for range 3 {
		recv(t, "three handlers to start", started)
	}
	kill() // no Stop: as if the process died
	<-a.Done()
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'started' and attempts_count = 1 and last_worker_id = $1::uuid`, a.ID()); n != 3 {
		t.Fatalf("%d tasks still held by the killed worker, want 3", n)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is null`, a.ID()); n != 1 {
		t.Error("a killed worker was marked stopped")
	}
	if s := a.Stats(); s.Abandoned != 3 || s.Failed != 0 || s.Completed != 0 {
		t.Errorf("stats of the killed worker %+v", s)
	}
}

// A deprecated worker stops claiming: its heartbeat sees deprecated_at, it
// stops polling, is marked stopped, and work queued afterwards stays queued.
func TestDeprecatedWorkerStopsClaiming(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	cfg := greetConfig("old")
	cfg.HeartbeatInterval = 20 * time.Millisecond
	w := start(t, db.Pool, cfg)
	if _, err := db.Pool.Exec(context.Background(), `update pgflow.workers set deprecated_at = now() where worker_id = $1::uuid`, w.ID()); err != nil {
		t.Fatal(err)
	}
	recv(t, "the deprecated worker to stop", w.Done())
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is not null and last_heartbeat_at > started_at`, w.ID()); n != 1 {
		t.Error("deprecated worker not marked stopped after heartbeats")
	}
	run := startRun(t, db.Pool, "old", map[string]any{})
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where run_id = $1::uuid and status = 'queued'`, run); n != 1 || w.Stats().Claimed != 0 {
		t.Errorf("work after deprecation: %d queued, %d claimed", n, w.Stats().Claimed)
	}
}

// As upstream counts it, a heartbeat that finds no worker row is a
// deprecation.
func TestMissingWorkerRowCountsAsDeprecated(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	cfg := greetConfig("gone")
	cfg.HeartbeatInterval = 20 * time.Millisecond
	w := start(t, db.Pool, cfg)
	if _, err := db.Pool.Exec(context.Background(), `delete from pgflow.workers where worker_id = $1::uuid`, w.ID()); err != nil {
		t.Fatal(err)
	}
	recv(t, "the worker to stop", w.Done())
}

// A stop cancels a server-side poll in flight: with MaxPollSeconds 60 and an
// empty queue, Stop still returns (within the hang guard, not timed).
func TestStopCancelsAPollInFlight(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	cfg := greetConfig("idle")
	cfg.MaxPollSeconds = 60
	w := start(t, db.Pool, cfg)
	// Wait until the poll is running in the database.
	for queryInt(t, db.Pool, `select count(*) from pg_catalog.pg_stat_activity where datname = pg_catalog.current_database() and query like '%read_with_poll%' and state = 'active' and pid <> pg_catalog.pg_backend_pid()`) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatalf("Stop with a 60 s poll in flight: %v", err)
	}
	if s := w.Stats(); s.WriteErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestRunStopsGracefullyWhenItsContextIsCancelled(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	started := make(chan struct{}, 1)
	var w *worker.Worker
	w, err := worker.New(db.Pool, worker.Config{Flow: greetFlow("signal"), Logger: testLogger(t), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"hello": func(context.Context, *worker.Task) (any, error) {
			started <- struct{}{}
			<-w.Stopping() // still running when the "signal" arrives
			return "finished", nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("signal")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	run := startRun(t, db.Pool, "signal", map[string]any{})
	recv(t, "the handler to start", started)
	cancel()
	if err := recv(t, "Run to return", errc); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := runStatus(t, db.Pool, run); s != "completed" {
		t.Errorf("run %s: the in-flight task was not finished", s)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is not null`, w.ID()); n != 1 {
		t.Error("not marked stopped")
	}
}
