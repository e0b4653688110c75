package worker_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// After a map step completes, the steps that depend on it are decided by
// their conditions: one whose required pattern is unmet is skipped, one whose
// forbidden pattern is absent runs, and the run completes. complete_task only
// looks for what comes next when a step completes (not on every task of the
// map), so this is what proves that nothing is left waiting by it.
func TestConditionsAfterAMapStepDecideOnItsCompletion(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ev := newEvents()
	done := newCounter()
	flow := worker.Flow{Slug: "gated", Steps: []worker.Step{
		{Slug: "items", Type: worker.StepMap},
		{Slug: "never", DependsOn: []string{"items"}, WhenUnmet: worker.PolicySkip,
			RequiredInputPattern: json.RawMessage(`{"items": [-1]}`)},
		{Slug: "report", DependsOn: []string{"items"},
			ForbiddenInputPattern: json.RawMessage(`{"items": [-1]}`)},
		{Slug: "final", DependsOn: []string{"report"}},
	}}
	echo := func(_ context.Context, t *worker.Task) (any, error) {
		done.add(t)
		var v any
		if err := t.DecodeInput(&v); err != nil {
			return nil, err
		}
		return v, nil
	}
	startN(t, db.Pool, 2, worker.Config{
		Flow: flow, Concurrency: 4, BatchSize: 5, OnResult: ev.onResult,
		Handlers: map[string]worker.HandlerFunc{"items": echo, "never": echo, "report": echo, "final": echo},
	})
	const n = 40
	input := make([]int, n)
	for i := range input {
		input[i] = i
	}
	run := startRun(t, db.Pool, "gated", input)
	ev.waitUntil(t, "the run to finish", func() bool { return runStatus(t, db.Pool, run) != "started" })

	if s := runStatus(t, db.Pool, run); s != "completed" {
		t.Fatalf("run %s, want completed", s)
	}
	rows, err := db.Pool.Query(context.Background(), `select step_slug, status from pgflow.step_states where run_id = $1::uuid order by step_slug`, run)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var slug, status string
		if err := rows.Scan(&slug, &status); err != nil {
			t.Fatal(err)
		}
		got[slug] = status
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"items": "completed", "never": "skipped", "report": "completed", "final": "completed"}
	for slug, status := range want {
		if got[slug] != status {
			t.Errorf("step %s is %q, want %q (all: %v)", slug, got[slug], status, got)
		}
	}
	assertEachTaskOnce(t, db.Pool, done, n+2)
	if left := queryInt(t, db.Pool, `select count(*) from pgmq.q_gated`); left != 0 {
		t.Errorf("%d messages left in the queue", left)
	}
}
