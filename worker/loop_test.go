package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// logRecords is a slog.Handler that sends every record at Warn or above to a
// channel, so tests wait on what the worker logs instead of sleeping.
type logRecords struct {
	ch    chan slog.Record
	attrs []slog.Attr
}

func newLogRecords() *logRecords { return &logRecords{ch: make(chan slog.Record, 10000)} }

func (l *logRecords) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(l.attrs...)
	select {
	case l.ch <- r:
	default:
	}
	return nil
}
func (l *logRecords) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecords{ch: l.ch, attrs: append(append([]slog.Attr(nil), l.attrs...), as...)}
}
func (l *logRecords) WithGroup(string) slog.Handler { return l }

// waitFor returns the first record whose message contains msg.
func (l *logRecords) waitFor(t *testing.T, msg string) slog.Record {
	t.Helper()
	guard := time.NewTimer(hangGuard)
	defer guard.Stop()
	for {
		select {
		case r := <-l.ch:
			if strings.Contains(r.Message, msg) {
				return r
			}
		case <-guard.C:
			t.Fatalf("gave up waiting for the log %q", msg)
		}
	}
}

func attrOf(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// A handler error goes to fail_task with the error's message; the engine
// retries until max attempts, then fails the run.
func TestFailingHandlerIsRetriedThenFailsTheRun(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	var calls atomic.Int32
	flow := worker.Flow{Slug: "flaky", Options: worker.FlowOptions{MaxAttempts: worker.Int(3), BaseDelay: worker.Int(0)},
		Steps: []worker.Step{{Slug: "try"}}}
	w := start(t, db.Pool, worker.Config{Flow: flow, OnResult: ev.onResult, Handlers: map[string]worker.HandlerFunc{
		"try": func(context.Context, *worker.Task) (any, error) {
			return nil, fmt.Errorf("boom on call %d", calls.Add(1))
		},
	}})
	run := startRun(t, db.Pool, "flaky", map[string]any{})
	ev.waitUntil(t, "the run to fail", func() bool { return runStatus(t, db.Pool, run) == "failed" })

	var status, msg string
	var count int
	if err := db.Pool.QueryRow(context.Background(),
		`select status, attempts_count, error_message from pgflow.step_tasks where run_id = $1::uuid`, run).Scan(&status, &count, &msg); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || count != 3 || msg != "boom on call 3" || calls.Load() != 3 {
		t.Errorf("task %s after %d attempts (%d calls) with %q", status, count, calls.Load(), msg)
	}
	stopNow(t, w) // the run fails before the last outcome is counted
	if s := w.Stats(); s.Failed != 3 || s.Completed != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestRetryWaitsTheEngineDelay(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	flow := worker.Flow{Slug: "slowretry", Options: worker.FlowOptions{MaxAttempts: worker.Int(3), BaseDelay: worker.Int(3600)},
		Steps: []worker.Step{{Slug: "try"}}}
	w := start(t, db.Pool, worker.Config{Flow: flow, OnResult: ev.onResult, Handlers: map[string]worker.HandlerFunc{
		"try": func(context.Context, *worker.Task) (any, error) { return nil, errors.New("not yet") },
	}})
	run := startRun(t, db.Pool, "slowretry", map[string]any{})
	r := recv(t, "the first failure", ev.ch)
	if r.Outcome != worker.OutcomeFailed || r.Task.RunID != run || r.Err == nil || r.Err.Error() != "not yet" {
		t.Fatalf("first outcome %+v", r)
	}
	// The engine's delay after attempt 1 is floor(3600 * 2^1) s: the message
	// is invisible for about two hours, so the worker cannot see it again.
	var queued bool
	var delay float64
	if err := db.Pool.QueryRow(context.Background(),
		`select t.status = 'queued', extract(epoch from q.vt - now())
		 from pgflow.step_tasks t join pgmq.q_slowretry q on q.msg_id = t.message_id
		 where t.run_id = $1::uuid`, run).Scan(&queued, &delay); err != nil {
		t.Fatal(err)
	}
	if !queued || delay < 7000 || delay > 7201 {
		t.Errorf("queued=%v, message visible in %.0f s, want about 7200", queued, delay)
	}
	if s := w.Stats(); s.Claimed != 1 {
		t.Errorf("claimed %d times", s.Claimed)
	}
}

func TestPanickingHandlerFailsItsTaskAndTheWorkerKeepsRunning(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	flow := worker.Flow{Slug: "panicky", Options: worker.FlowOptions{MaxAttempts: worker.Int(1)},
		Steps: []worker.Step{{Slug: "maybe"}}}
	w := start(t, db.Pool, worker.Config{Flow: flow, OnResult: ev.onResult, Handlers: map[string]worker.HandlerFunc{
		"maybe": func(ctx context.Context, t *worker.Task) (any, error) {
			var in struct{ Panic bool }
			if err := t.DecodeFlowInput(ctx, &in); err != nil {
				return nil, err
			}
			if in.Panic {
				panic("kaboom")
			}
			return "fine", nil
		},
	}})
	bad := startRun(t, db.Pool, "panicky", map[string]bool{"panic": true})
	r := recv(t, "the panic's outcome", ev.ch)
	if r.Outcome != worker.OutcomeFailed || !r.Panicked {
		t.Fatalf("outcome %+v", r)
	}
	var msg string
	if err := db.Pool.QueryRow(context.Background(), `select error_message from pgflow.step_tasks where run_id = $1::uuid and status = 'failed'`, bad).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	if msg != "panic: kaboom" {
		t.Errorf("error_message %q", msg)
	}
	if s := runStatus(t, db.Pool, bad); s != "failed" {
		t.Errorf("run is %s", s)
	}

	good := startRun(t, db.Pool, "panicky", map[string]bool{"panic": false})
	ev.waitUntil(t, "the second run", func() bool { return runStatus(t, db.Pool, good) == "completed" })
	stopNow(t, w)
	if s := w.Stats(); s.Panicked != 1 || s.Completed != 1 || s.Failed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// A claim error (here start_tasks fails: a test trigger refuses the task
// update) is logged, counted and backed off; nothing is claimed, no attempt
// is used, the worker keeps running, and once claims work again the
// messages come back after their visibility timeout and are claimed.
func TestClaimErrorIsLoggedAndTheMessagesComeBack(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		create table public.block_claims (reason text);
		insert into public.block_claims values ('claims blocked by the test');
		create function public.refuse_claim() returns trigger language plpgsql set search_path = '' as $$
		declare v_reason text;
		begin
		  select b.reason into v_reason from public.block_claims b limit 1;
		  if v_reason is not null then raise exception '%', v_reason; end if;
		  return new;
		end $$;
		create trigger refuse_claim before update on pgflow.step_tasks for each row
		  when (old.status = 'queued' and new.status = 'started') execute function public.refuse_claim();`); err != nil {
		t.Fatal(err)
	}
	logs := newLogRecords()
	ev := newEvents()
	cfg := greetConfig("blocked")
	cfg.VisibilityTimeout, cfg.OnResult, cfg.Logger = time.Second, ev.onResult, slog.New(logs)
	w := start(t, db.Pool, cfg)
	run := startRun(t, db.Pool, "blocked", map[string]any{})

	r := logs.waitFor(t, "poll or claim failed")
	if err, _ := attrOf(r, "error").Any().(error); err == nil || !strings.Contains(err.Error(), "claims blocked by the test") {
		t.Errorf("logged error %v", attrOf(r, "error"))
	}
	if s := w.Stats(); s.ClaimErrors < 1 || s.Claimed != 0 {
		t.Errorf("stats %+v", s)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where run_id = $1::uuid and status = 'queued' and attempts_count = 0 and last_worker_id is null`, run); n != 1 {
		t.Error("a failed claim changed the task")
	}
	select {
	case <-w.Done():
		t.Fatal("a claim error stopped the worker")
	default:
	}
	if _, err := db.Pool.Exec(ctx, `delete from public.block_claims`); err != nil {
		t.Fatal(err)
	}
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	if n := queryInt(t, db.Pool, `select attempts_count from pgflow.step_tasks where run_id = $1::uuid`, run); n != 1 {
		t.Errorf("%d attempts, want 1: a failed claim must not use one", n)
	}
}

// A message with no claimable task (here a foreign message in the flow's
// queue) is warned about with its queue, exact id, flow and step, and left
// to come back after its visibility timeout; the other work goes on.
func TestUnclaimedMessagesAreWarnedAndLeftInTheQueue(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	if _, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("lonely")); err != nil {
		t.Fatal(err)
	}
	var foreign int64
	if err := db.Pool.QueryRow(ctx, `select pgmq.send('lonely', '{"not": "a task"}'::jsonb)`).Scan(&foreign); err != nil {
		t.Fatal(err)
	}
	run := startRun(t, db.Pool, "lonely", map[string]any{})
	logs := newLogRecords()
	ev := newEvents()
	cfg := greetConfig("lonely")
	cfg.OnResult, cfg.Logger = ev.onResult, slog.New(logs)
	w := start(t, db.Pool, cfg)

	r := logs.waitFor(t, "not claimed")
	ids, _ := attrOf(r, "msg_ids").Any().([]string)
	if len(ids) != 1 || ids[0] != fmt.Sprint(foreign) || attrOf(r, "queue_name").String() != "lonely" ||
		attrOf(r, "flow_slug").String() != "lonely" {
		t.Errorf("warning %v: msg_ids %v, queue %v, flow %v", r.Message, attrOf(r, "msg_ids"), attrOf(r, "queue_name"), attrOf(r, "flow_slug"))
	}
	ev.waitUntil(t, "the run to complete", func() bool { return runStatus(t, db.Pool, run) == "completed" })
	if n := queryInt(t, db.Pool, `select count(*) from pgmq.q_lonely where msg_id = $1 and read_ct >= 1`, foreign); n != 1 {
		t.Error("the foreign message left its queue")
	}
	if s := w.Stats(); s.Unclaimed < 1 || s.ClaimErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// claimWaves runs 8 map tasks on one worker with 4 slots. The first poll
// takes 4 tasks whose handlers hold their slots until released; release
// frees them one at a time, and the remaining 4 tasks report how many
// start_tasks calls had returned when each of their handlers started, in
// the order they started.
func claimWaves(t *testing.T, linger time.Duration, release func(gate chan<- struct{}, ev *events)) []int64 {
	t.Helper()
	db := upgraded(t)
	ev := newEvents()
	var w atomic.Pointer[worker.Worker]
	var starts atomic.Int64
	first := make(chan struct{}, 4)
	gate := make(chan struct{})
	later := make(chan int64, 4)
	flow := worker.Flow{Slug: "waves", Steps: []worker.Step{{Slug: "item", Type: worker.StepMap}}}
	if _, err := worker.EnsureFlow(context.Background(), db.Pool, flow); err != nil {
		t.Fatal(err)
	}
	startRun(t, db.Pool, "waves", []int{0, 1, 2, 3, 4, 5, 6, 7})
	wk, err := worker.New(db.Pool, worker.Config{
		Flow: flow, Concurrency: 4, BatchSize: 4, ClaimLinger: linger, OnResult: ev.onResult, Logger: testLogger(t),
		Handlers: map[string]worker.HandlerFunc{"item": func(ctx context.Context, _ *worker.Task) (any, error) {
			if starts.Add(1) <= 4 {
				first <- struct{}{}
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return nil, nil
			}
			later <- w.Load().Stats().ClaimCalls
			return nil, nil
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Store(wk)
	if err := wk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := wk.Stop(context.Background()); err != nil {
			t.Errorf("stopping worker: %v", err)
		}
	})
	for range 4 {
		recv(t, "a first-wave handler to start", first)
	}
	release(gate, ev)
	var got []int64
	for range 4 {
		got = append(got, recv(t, "a later task's handler", later))
	}
	return got
}

// With a linger, slots freed one at a time while other handlers still run
// are polled for together: the 4 later tasks all came from the second claim.
func TestClaimLingerClaimsFreedSlotsTogether(t *testing.T) {
	t.Parallel()
	got := claimWaves(t, time.Minute, func(gate chan<- struct{}, ev *events) {
		for range 4 {
			gate <- struct{}{}
			recv(t, "the released task's outcome", ev.ch) // only first-wave tasks can finish before all 4 are free
		}
	})
	for i, calls := range got {
		if calls != 2 {
			t.Errorf("later task %d started after %d claim calls, want 2 (all 4 in one claim): %v", i, calls, got)
		}
	}
}

// Without it, every freed slot is polled for at once.
func TestNoClaimLingerClaimsEachFreedSlot(t *testing.T) {
	t.Parallel()
	got := claimWaves(t, worker.NoClaimLinger, func(gate chan<- struct{}, _ *events) {
		gate <- struct{}{}
		go func() { // the other 3 once the later tasks are done (the test reads them first)
			for range 3 {
				gate <- struct{}{}
			}
		}()
	})
	// Slots free as handlers finish, and each free slot is polled for at
	// once: the 4 later tasks cannot all come from one claim.
	if got[0] < 2 || got[len(got)-1] <= got[0] {
		t.Errorf("later tasks started after claim calls %v: want them spread over more than one claim after the first", got)
	}
}

// A linger does not wait past ClaimLinger for slots that running handlers
// hold: with 3 handlers blocked, the one freed slot is polled for and its
// task runs (and completes) before any of them is released.
func TestClaimLingerDoesNotWaitForRunningHandlers(t *testing.T) {
	t.Parallel()
	got := claimWaves(t, 10*time.Millisecond, func(gate chan<- struct{}, ev *events) {
		gate <- struct{}{}
		recv(t, "the released task's outcome", ev.ch)
		recv(t, "a later task's outcome while 3 handlers still run", ev.ch)
		go func() {
			for range 3 {
				gate <- struct{}{}
			}
		}()
	})
	if got[0] != 2 || got[len(got)-1] <= 2 {
		t.Errorf("later tasks started after claim calls %v: want the first from the second claim alone", got)
	}
}
