package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
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

// Flow mode: four workers on the one queue "dag" serve every step; the root
// step gets the flow input on its claim, a dependent step reads it lazily.
func TestFlowModeDAGCompletesWithFourWorkers(t *testing.T) {
	testdb.SkipIfShort(t, "a flow-mode DAG of many runs completes with four workers at once")
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
		"first": func(ctx context.Context, t *worker.Task) (any, error) {
			check(t.FlowInput != nil) // a root single step's claim carries it
			var in struct{ N int }
			if err := t.DecodeFlowInput(ctx, &in); err != nil {
				return nil, err
			}
			success.add(t)
			return in.N + 1, nil
		},
		"second": func(ctx context.Context, t *worker.Task) (any, error) {
			check(t.FlowInput == nil) // not on a dependent step's claim: read from pgflow.runs
			var in struct{ First int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			var flow struct{ N int }
			if err := t.DecodeFlowInput(ctx, &flow); err != nil {
				return nil, err
			}
			check(in.First == flow.N+1 && t.QueueName == "dag")
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
		t.Error("a handler saw the wrong input, flow input or queue")
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where attempts_count <> 1 or queue_name <> 'dag'`); n != 0 {
		t.Errorf("%d tasks took more than one attempt or were not on queue dag", n)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers where queue_name = 'dag'`); n != 4 {
		t.Errorf("%d workers registered on queue dag, want 4", n)
	}
	var total int64
	for _, w := range workers {
		stopNow(t, w)
		total += w.Stats().Completed
	}
	if total != runs*3 {
		t.Errorf("workers completed %d tasks, want %d", total, runs*3)
	}
}

// Step mode: each step on its own queue (the readable name, or the index
// fallback for a step slug too long for it), one worker per step, each
// claiming only its step's tasks; the run completes across them.
func TestStepModeRunsEachStepOnItsOwnQueue(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	ev := newEvents()
	success := newCounter()
	long := "summarize_every_resized_picture_of_the_run_now" // pics__<long> is 52 chars: fallback pics__2
	flow := worker.Flow{Slug: "Pics", QueueMode: worker.QueueModeStep, Options: worker.FlowOptions{BaseDelay: worker.Int(0)}, Steps: []worker.Step{
		{Slug: "list"},
		{Slug: "resize", Type: worker.StepMap, DependsOn: []string{"list"}},
		{Slug: long, DependsOn: []string{"resize"}},
	}}
	var wrongQueue atomic.Int32
	var mu sync.Mutex
	servedBy := map[string]map[string]bool{} // step -> queues its tasks came from
	note := func(t *worker.Task) {
		mu.Lock()
		defer mu.Unlock()
		if servedBy[t.StepSlug] == nil {
			servedBy[t.StepSlug] = map[string]bool{}
		}
		servedBy[t.StepSlug][t.QueueName] = true
		success.add(t)
	}
	handlers := map[string]worker.HandlerFunc{
		"list": func(ctx context.Context, t *worker.Task) (any, error) {
			var in struct{ N int }
			if err := t.DecodeFlowInput(ctx, &in); err != nil {
				return nil, err
			}
			note(t)
			out := make([]int, in.N)
			for i := range out {
				out[i] = i
			}
			return out, nil
		},
		"resize": func(_ context.Context, t *worker.Task) (any, error) {
			var i int
			if err := t.DecodeInput(&i); err != nil {
				return nil, err
			}
			note(t)
			return i * 2, nil
		},
		long: func(ctx context.Context, t *worker.Task) (any, error) {
			var in struct{ Resize []int }
			if err := t.DecodeInput(&in); err != nil {
				return nil, err
			}
			var flowIn struct{ N int }
			if err := t.DecodeFlowInput(ctx, &flowIn); err != nil { // lazy: not on this claim
				return nil, err
			}
			sum := 0
			for _, v := range in.Resize {
				sum += v
			}
			note(t)
			return map[string]int{"n": flowIn.N, "sum": sum}, nil
		},
	}
	want := map[string]string{"list": "pics__list", "resize": "pics__resize", long: "pics__2"}
	var workers []*worker.Worker
	for _, st := range flow.Steps {
		w := start(t, db.Pool, worker.Config{Flow: flow, StepSlug: st.Slug, Handlers: handlers, Concurrency: 4, OnResult: func(r worker.Result) {
			if r.Task.QueueName != want[r.Task.StepSlug] {
				wrongQueue.Add(1)
			}
			ev.onResult(r)
		}})
		if w.Queue() != want[st.Slug] {
			t.Errorf("step %s: worker polls %q, want %q", st.Slug, w.Queue(), want[st.Slug])
		}
		workers = append(workers, w)
	}
	const n = 6
	run := startRun(t, db.Pool, "Pics", map[string]int{"n": n})
	ev.waitUntil(t, "the run to finish", func() bool { return runStatus(t, db.Pool, run) != "started" })

	var out string
	if err := db.Pool.QueryRow(ctx, `select status || ' ' || output::text from pgflow.runs where run_id = $1::uuid`, run).Scan(&out); err != nil {
		t.Fatal(err)
	}
	if wantOut := fmt.Sprintf(`completed {"%s": {"n": %d, "sum": %d}}`, long, n, 30); out != wantOut {
		t.Errorf("run: %s, want %s", out, wantOut)
	}
	assertEachTaskOnce(t, db.Pool, success, 1+n+1)
	if wrongQueue.Load() != 0 {
		t.Errorf("%d tasks came from another step's queue", wrongQueue.Load())
	}
	for i, w := range workers {
		stopNow(t, w)
		slug := flow.Steps[i].Slug
		wantDone := int64(1)
		if slug == "resize" {
			wantDone = n
		}
		if s := w.Stats(); s.Completed != wantDone || s.Claimed != wantDone {
			t.Errorf("worker of %s: stats %+v, want %d claimed and completed", slug, s, wantDone)
		}
		var stored, registered string
		if err := db.Pool.QueryRow(ctx, `select s.queue_name, w.queue_name from pgflow.steps s, pgflow.workers w
			where s.flow_slug = 'Pics' and s.step_slug = $1 and w.worker_id = $2::uuid`, slug, w.ID()).Scan(&stored, &registered); err != nil {
			t.Fatal(err)
		}
		if stored != want[slug] || registered != want[slug] {
			t.Errorf("step %s: stored route %q, worker registered on %q, want %q", slug, stored, registered, want[slug])
		}
		if n := queryInt(t, db.Pool, `select count(*) from pgmq.list_queues() where queue_name = $1`, want[slug]); n != 1 {
			t.Errorf("queue %s listed %d times", want[slug], n)
		}
		if n := queryInt(t, db.Pool, `select count(*) from pgflow.step_tasks where step_slug = $1 and queue_name <> $2`, slug, want[slug]); n != 0 {
			t.Errorf("%d tasks of %s on another queue", n, slug)
		}
	}
}

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

func TestMapFlowOfManyTasksWithFourWorkers(t *testing.T) {
	testdb.SkipIfShort(t, "map flow of many tasks with four workers")
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	success := newCounter()
	const n = 500
	workers := startN(t, db.Pool, 4, worker.Config{Flow: mapFlow("fanout"), Concurrency: 8, BatchSize: 10, OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"work": func(_ context.Context, tk *worker.Task) (any, error) {
			var i int
			if err := tk.DecodeInput(&i); err != nil {
				return nil, err
			}
			if i != tk.TaskIndex {
				return nil, fmt.Errorf("element %d at index %d", i, tk.TaskIndex)
			}
			success.add(tk)
			return i * i, nil
		}}})
	run := startRun(t, db.Pool, "fanout", indexes(n))
	ev.waitUntil(t, "the run to finish", func() bool { return runStatus(t, db.Pool, run) != "started" })
	var out []int
	var raw json.RawMessage
	if err := db.Pool.QueryRow(context.Background(), `select output->'work' from pgflow.runs where run_id = $1::uuid and status = 'completed'`, run).Scan(&raw); err != nil {
		t.Fatalf("run not completed: %v", err)
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) != n || out[n-1] != (n-1)*(n-1) {
		t.Errorf("map output %d elements, last %v (%v)", len(out), out[len(out)-1:], err)
	}
	assertEachTaskOnce(t, db.Pool, success, n)
	var claimed int64
	for _, w := range workers {
		claimed += w.Stats().Claimed
	}
	if claimed != n {
		t.Errorf("claimed %d tasks, want %d", claimed, n)
	}
	if left := queryInt(t, db.Pool, `select count(*) from pgmq.q_fanout`); left != 0 {
		t.Errorf("%d messages left in the queue", left)
	}
}

// Message ids above 2^53 (what a float64 cannot hold) go through the poll,
// start_tasks and the outcome exactly, in both modes: were one rounded,
// start_tasks would claim nothing and the run would never finish.
func TestMessageIDsAbove2To53AreExact(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	const first = int64(9007199254740993) // 2^53 + 1
	for _, cfg := range []worker.Config{
		{Flow: mapFlow("big")},
		{Flow: worker.Flow{Slug: "big_steps", QueueMode: worker.QueueModeStep, Steps: mapFlow("x").Steps}, StepSlug: "work"},
	} {
		slug := cfg.Flow.Slug
		if _, err := worker.EnsureFlow(ctx, db.Pool, cfg.Flow); err != nil {
			t.Fatal(err)
		}
		w0, err := worker.New(db.Pool, withHandlers(cfg, nil))
		if err != nil {
			t.Fatal(err)
		}
		queue := w0.Queue()
		// The queue's identity sequence: the next message id is 2^53 + 1.
		if _, err := db.Pool.Exec(ctx, `select pg_catalog.setval(pg_catalog.pg_get_serial_sequence(pg_catalog.format('pgmq.%I', 'q_' || $1::text), 'msg_id'), $2::bigint)`,
			queue, first-1); err != nil {
			t.Fatal(err)
		}
		ev := newEvents()
		got := map[int]int64{} // task index -> message id seen by the worker
		var mu sync.Mutex
		c := withHandlers(cfg, func(_ context.Context, tk *worker.Task) (any, error) { return tk.TaskIndex, nil })
		c.OnResult = func(r worker.Result) {
			mu.Lock()
			got[r.Task.TaskIndex] = r.Task.MessageID
			mu.Unlock()
			ev.onResult(r)
		}
		start(t, db.Pool, c)
		run := startRun(t, db.Pool, slug, indexes(3))
		// The run completes before the last OnResult is called: wait for both.
		ev.waitUntil(t, "the run to finish and every outcome", func() bool {
			mu.Lock()
			n := len(got)
			mu.Unlock()
			return n == 3 && runStatus(t, db.Pool, run) != "started"
		})
		if s := runStatus(t, db.Pool, run); s != "completed" {
			t.Fatalf("%s: run %s", slug, s)
		}
		rows, err := db.Pool.Query(ctx, `select task_index, message_id from pgflow.step_tasks where run_id = $1::uuid order by task_index`, run)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for rows.Next() {
			var idx int
			var id int64
			if err := rows.Scan(&idx, &id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, fmt.Sprint(id))
			mu.Lock()
			if id < first || got[idx] != id {
				t.Errorf("%s: task %d has message %d in the database, the worker saw %d", slug, idx, id, got[idx])
			}
			mu.Unlock()
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(ids, ","), "9007199254740993") {
			t.Errorf("%s: message ids %v do not include 2^53+1", slug, ids)
		}
	}
}
