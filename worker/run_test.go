package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// A 3-step DAG: first -> second -> third, and third also reads first.
func dagFlow() worker.Flow {
	return worker.Flow{Slug: "dag", Options: worker.FlowOptions{BaseDelay: worker.Int(0)}, Steps: []worker.Step{
		{Slug: "first"},
		{Slug: "second", DependsOn: []string{"first"}},
		{Slug: "third", DependsOn: []string{"first", "second"}},
	}}
}

func TestDAGFlowCompletesWithFourWorkers(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	success := newCounter()
	var inputsOK atomic.Bool
	inputsOK.Store(true)
	check := func(ok bool) {
		if !ok {
			inputsOK.Store(false)
		}
	}
	handlers := map[string]worker.HandlerFunc{
		"first": func(_ context.Context, t *worker.Task) (any, error) {
			var in struct{ N int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			check(string(t.Input) == string(t.FlowInput) && t.Attempt == 1)
			success.add(t)
			return in.N + 1, nil
		},
		"second": func(_ context.Context, t *worker.Task) (any, error) {
			var in struct{ First int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			var flow struct{ N int }
			if err := t.DecodeFlowInput(&flow); err != nil {
				return nil, err
			}
			check(in.First == flow.N+1)
			success.add(t)
			return in.First * 10, nil
		},
		"third": func(_ context.Context, t *worker.Task) (any, error) {
			var in struct{ First, Second int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			success.add(t)
			return map[string]int{"sum": in.First + in.Second}, nil
		},
	}
	workers := startN(t, db.Pool, 4, worker.Config{
		Flow: dagFlow(), Handlers: handlers, Concurrency: 3, BatchSize: 2, OnResult: ev.onResult,
	})
	const runs = 40
	ids := map[string]int{}
	for i := range runs {
		ids[startRun(t, db.Pool, "dag", map[string]int{"n": i})] = i
	}
	ev.waitUntil(t, "every run to finish", func() bool {
		return queryInt(t, db.Pool, `select count(*) from pgflow.runs where status <> 'started'`) == runs
	})

	for id, i := range ids {
		var status string
		var out json.RawMessage
		if err := db.Pool.QueryRow(context.Background(), `select status, output from pgflow.runs where run_id = $1::uuid`, id).Scan(&status, &out); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`{"third": {"sum": %d}}`, (i+1)+(i+1)*10)
		if status != "completed" || string(out) != want {
			t.Errorf("run %d: %s %s, want completed %s", i, status, out, want)
		}
	}
	assertEachTaskOnce(t, db.Pool, success, runs*3)
	if !inputsOK.Load() {
		t.Error("a handler saw the wrong input, flow input or attempt")
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where attempts_count <> 1`); n != 0 {
		t.Errorf("%d tasks took more than one attempt", n)
	}
	var total int64
	for _, w := range workers {
		total += w.Stats().Completed
	}
	if total != runs*3 {
		t.Errorf("workers completed %d tasks, want %d", total, runs*3)
	}
}

func TestMapFlowOfThousandTasksWithFourWorkers(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	success := newCounter()
	flow := worker.Flow{Slug: "squares", Steps: []worker.Step{
		{Slug: "square", Type: worker.StepMap},
		{Slug: "total", DependsOn: []string{"square"}},
	}}
	handlers := map[string]worker.HandlerFunc{
		"square": func(_ context.Context, t *worker.Task) (any, error) {
			var x int
			if err := t.DecodeInput(&x); err != nil {
				return nil, err
			}
			if x != t.TaskIndex {
				return nil, fmt.Errorf("task %d got element %d", t.TaskIndex, x)
			}
			success.add(t)
			return x * x, nil
		},
		"total": func(_ context.Context, t *worker.Task) (any, error) {
			var in struct{ Square []int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			sum := 0
			for _, v := range in.Square {
				sum += v
			}
			success.add(t)
			return map[string]int{"n": len(in.Square), "sum": sum}, nil
		},
	}
	workers := startN(t, db.Pool, 4, worker.Config{
		Flow: flow, Handlers: handlers, Concurrency: 8, BatchSize: 10, OnResult: ev.onResult,
	})
	const n = 1000
	input := make([]int, n)
	for i := range input {
		input[i] = i
	}
	run := startRun(t, db.Pool, "squares", input)
	ev.waitUntil(t, "the run to finish", func() bool { return runStatus(t, db.Pool, run) != "started" })

	var out json.RawMessage
	if err := db.Pool.QueryRow(context.Background(), `select output from pgflow.runs where run_id = $1::uuid`, run).Scan(&out); err != nil {
		t.Fatal(err)
	}
	want := 0
	for i := range n {
		want += i * i
	}
	if s := fmt.Sprintf(`{"total": {"n": %d, "sum": %d}}`, n, want); string(out) != s {
		t.Errorf("run output %s, want %s (status %s)", out, s, runStatus(t, db.Pool, run))
	}
	assertEachTaskOnce(t, db.Pool, success, n+1)
	var claimed, completed, fatal int64
	busy := 0
	for _, w := range workers {
		s := w.Stats()
		claimed += s.Claimed
		completed += s.Completed
		fatal += s.Fatal
		if s.Completed > 0 {
			busy++
		}
	}
	if claimed != n+1 || completed != n+1 || fatal != 0 {
		t.Errorf("claimed %d, completed %d, fatal %d; want %d, %d, 0", claimed, completed, fatal, n+1, n+1)
	}
	if busy < 2 {
		t.Errorf("only %d of 4 workers completed anything", busy)
	}
}

func TestFailingHandlerIsRetriedThenFailsTheRun(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	var mu sync.Mutex
	var attempts []int
	flow := worker.Flow{Slug: "flaky", Options: worker.FlowOptions{MaxAttempts: worker.Int(3), BaseDelay: worker.Int(0)},
		Steps: []worker.Step{{Slug: "try"}}}
	w := start(t, db.Pool, worker.Config{Flow: flow, OnResult: ev.onResult, Handlers: map[string]worker.HandlerFunc{
		"try": func(_ context.Context, t *worker.Task) (any, error) {
			mu.Lock()
			attempts = append(attempts, t.Attempt)
			mu.Unlock()
			return nil, fmt.Errorf("boom on attempt %d", t.Attempt)
		},
	}})
	run := startRun(t, db.Pool, "flaky", map[string]any{})
	ev.waitUntil(t, "the run to fail", func() bool { return runStatus(t, db.Pool, run) == "failed" })

	mu.Lock()
	got := fmt.Sprint(attempts)
	mu.Unlock()
	if got != "[1 2 3]" {
		t.Errorf("handler saw attempts %s, want [1 2 3]", got)
	}
	var status, msg string
	var count int
	if err := db.Pool.QueryRow(context.Background(),
		`select status, attempts_count, error_message from pgflow.step_tasks where run_id = $1::uuid`, run).Scan(&status, &count, &msg); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || count != 3 || msg != "boom on attempt 3" {
		t.Errorf("task %s after %d attempts with %q", status, count, msg)
	}
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
		"maybe": func(_ context.Context, t *worker.Task) (any, error) {
			var in struct{ Panic bool }
			if err := t.DecodeInput(&in); err != nil {
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
	if !strings.Contains(msg, "panic: kaboom") {
		t.Errorf("error_message %q", msg)
	}
	if s := runStatus(t, db.Pool, bad); s != "failed" {
		t.Errorf("run is %s", s)
	}

	good := startRun(t, db.Pool, "panicky", map[string]bool{"panic": false})
	ev.waitUntil(t, "the second run", func() bool { return runStatus(t, db.Pool, good) == "completed" })
	if s := w.Stats(); s.Panicked != 1 || s.Completed != 1 || s.Failed != 1 {
		t.Errorf("stats %+v", s)
	}
}

// claimWaves runs 8 map tasks on one worker with 4 slots. The first claim
// takes 4 tasks whose handlers hold their slots until released; release
// frees them one at a time, and the remaining 4 tasks report how many
// claim_tasks calls had returned when each of their handlers started, in the
// order they started.
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
// are claimed together: the 4 later tasks all came from the second claim.
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

// Without it, every freed slot is claimed at once: one slot freed, and the 4
// later tasks run through it one claim each.
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
	// Slots free as handlers finish, and each free slot is claimed at once:
	// the 4 later tasks cannot all come from one claim call (how many calls
	// exactly depends on how the completions interleave with the claims).
	if got[0] < 2 || got[len(got)-1] <= got[0] {
		t.Errorf("later tasks started after claim calls %v: want them spread over more than one claim after the first", got)
	}
}
