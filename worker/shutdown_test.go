package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

func mapFlow(slug string) worker.Flow {
	return worker.Flow{Slug: slug, Steps: []worker.Step{{Slug: "work", Type: worker.StepMap}}}
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func TestGracefulShutdownMidBatch(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	ev := newEvents()
	success := newCounter()

	// Worker A has 4 slots. The first two handlers to start finish once the
	// stop has begun (inside the soft timeout); the other two only return
	// when the soft timeout is over and their context is cancelled.
	var a *worker.Worker
	var nth atomic.Int32
	started := make(chan int, 8)
	var err error
	a, err = worker.New(db.Pool, worker.Config{
		Flow: mapFlow("drain"), Concurrency: 4, BatchSize: 4, ShutdownTimeout: 300 * time.Millisecond,
		Logger: testLogger(t), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(ctx context.Context, tk *worker.Task) (any, error) {
			n := nth.Add(1)
			started <- tk.TaskIndex
			if n <= 2 {
				<-a.Stopping()
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
	outcomes := map[worker.Outcome]int{}
	for len(ev.ch) > 0 {
		outcomes[(<-ev.ch).Outcome]++
	}
	if outcomes[worker.OutcomeCompleted] != 2 || outcomes[worker.OutcomeReleased] != 2 || len(outcomes) != 2 {
		t.Errorf("outcomes before Stop returned: %v, want 2 completed and 2 released", outcomes)
	}
	if s := a.Stats(); s.Claimed != 4 || s.Completed != 2 || s.Released != 2 || s.Failed != 0 || s.Abandoned != 0 {
		t.Errorf("stats %+v", s)
	}
	// Finished ones are completed; released ones are queued, attempt not
	// consumed, message visible now; the rest were never touched.
	rows := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'completed' and attempts_count = 1`)
	queuedVisible := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks t join pgmq.q_drain q on q.msg_id = t.message_id
		where t.status = 'queued' and t.attempts_count = 0 and q.vt <= clock_timestamp()`)
	if rows != 2 || queuedVisible != 6 {
		t.Errorf("%d completed, %d queued and visible; want 2 and 6", rows, queuedVisible)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is not null`, a.ID()); n != 1 {
		t.Error("worker A not marked stopped")
	}

	// Another worker finishes the run: nothing lost, nothing done twice.
	start(t, db.Pool, worker.Config{Flow: mapFlow("drain"), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(_ context.Context, tk *worker.Task) (any, error) {
			success.add(tk)
			return tk.TaskIndex, nil
		}}})
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	assertEachTaskOnce(t, db.Pool, success, 8)
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where attempts_count <> 1`); n != 0 {
		t.Errorf("%d tasks used more than one attempt (a release must not consume one)", n)
	}
}

func TestStopWithExpiredContextReleasesAtOnce(t *testing.T) {
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
	if s := w.Stats(); s.Released != 2 {
		t.Errorf("stats %+v, want 2 released", s)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'queued' and attempts_count = 0`); n != 2 {
		t.Errorf("%d tasks queued again, want 2", n)
	}
}

func TestKilledWorkerTasksReturnAfterVisibilityTimeout(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	success := newCounter()

	started := make(chan struct{}, 3)
	killCtx, kill := context.WithCancel(context.Background())
	defer kill()
	a, err := worker.New(db.Pool, worker.Config{
		Flow: mapFlow("crash"), Concurrency: 3, VisibilityTimeout: time.Second, Logger: testLogger(t), OnResult: ev.onResult,
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
	run := startRun(t, db.Pool, "crash", indexes(3))
	for range 3 {
		recv(t, "three handlers to start", started)
	}
	kill() // no Stop: as if the process died
	<-a.Done()

	// Nothing was written for A's tasks: still started by A, attempt 1, and A
	// is not marked stopped.
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where status = 'started' and attempts_count = 1 and last_worker_id = $1::uuid`, a.ID()); n != 3 {
		t.Fatalf("%d tasks still held by the killed worker, want 3", n)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is null`, a.ID()); n != 1 {
		t.Error("a killed worker was marked stopped")
	}
	if s := a.Stats(); s.Abandoned != 3 || s.Released != 0 || s.Failed != 0 {
		t.Errorf("stats of the killed worker %+v", s)
	}

	// B claims them once their visibility timeout has passed.
	b := start(t, db.Pool, worker.Config{Flow: mapFlow("crash"), OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(_ context.Context, tk *worker.Task) (any, error) {
			if tk.Attempt != 2 {
				return nil, errors.New("expected the second attempt")
			}
			success.add(tk)
			return "ok", nil
		}}})
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	assertEachTaskOnce(t, db.Pool, success, 3)
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where last_worker_id = $1::uuid and attempts_count = 2`, b.ID()); n != 3 {
		t.Errorf("%d tasks completed by B on attempt 2, want 3", n)
	}
}

func TestDeprecatedWorkerStopsGracefully(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	w := start(t, db.Pool, worker.Config{Flow: greetFlow("old"), HeartbeatInterval: 20 * time.Millisecond,
		Handlers: greetConfig("old").Handlers})
	if _, err := db.Pool.Exec(context.Background(), `update pgflow.workers set deprecated_at = now() where worker_id = $1::uuid`, w.ID()); err != nil {
		t.Fatal(err)
	}
	recv(t, "the deprecated worker to stop", w.Done())
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid and stopped_at is not null and last_heartbeat_at > started_at`, w.ID()); n != 1 {
		t.Error("deprecated worker not marked stopped after heartbeats")
	}
}

func TestFatalClaimResultsAreReportedNotDropped(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	ev := newEvents()
	if _, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("greet")); err != nil {
		t.Fatal(err)
	}
	var foreign int64
	if err := db.Pool.QueryRow(ctx, `select pgmq.send('greet', '{"not": "a task"}'::jsonb)`).Scan(&foreign); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, db.Pool, "greet", map[string]any{})
	fatal := make(chan worker.FatalClaimError, 10)
	cfg := greetConfig("greet")
	cfg.OnResult, cfg.OnFatal = ev.onResult, func(f worker.FatalClaimError) { fatal <- f }
	w := start(t, db.Pool, cfg)

	f := recv(t, "the fatal claim result", fatal)
	if f.QueueName != "greet" || f.MessageID != foreign || f.Reason != worker.ReasonNoTask {
		t.Errorf("fatal %+v, want greet/%d no_task", f, foreign)
	}
	// The valid message of the batch was not lost: the run still completes.
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	if n := queryInt(t, db.Pool, `select count(*) from pgmq.q_greet where msg_id = $1`, foreign); n != 1 {
		t.Error("the foreign message left its queue")
	}
	if s := w.Stats(); s.Fatal != 1 {
		t.Errorf("stats %+v, want 1 fatal", s)
	}
}

func TestHeartbeatRegistersAgainWhenTheRowIsGone(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	ev := newEvents()
	cfg := greetConfig("again")
	cfg.HeartbeatInterval, cfg.OnResult = 20*time.Millisecond, ev.onResult
	w := start(t, db.Pool, cfg)
	if _, err := db.Pool.Exec(ctx, `delete from pgflow.workers where worker_id = $1::uuid`, w.ID()); err != nil {
		t.Fatal(err)
	}
	// claim_tasks records last_worker_id (a foreign key to pgflow.workers),
	// so the run only completes once the heartbeat has put the row back.
	run := startRun(t, db.Pool, "again", map[string]any{})
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where worker_id = $1::uuid`, w.ID()); n != 1 {
		t.Errorf("worker row not restored (%d rows)", n)
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
