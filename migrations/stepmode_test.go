package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func shapeStep(slug string, deps ...string) string {
	d := `[]`
	if len(deps) > 0 {
		d = `["` + strings.Join(deps, `", "`) + `"]`
	}
	return `{"slug": "` + slug + `", "stepType": "single", "dependencies": ` + d + `, "whenUnmet": "skip", "whenExhausted": "fail",
	         "requiredInputPattern": {"defined": false}, "forbiddenInputPattern": {"defined": false}}`
}

// Step mode: startup compilation with a route map creates one private queue
// per step; claims name the step; add_step refuses; delete drops the queues.
func TestStepModeFlow(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	applyMigration(t, db.Pool)
	p := db.Pool
	shape := `{"steps": [` + shapeStep("fetch") + `, ` + shapeStep("Store", "fetch") + `]}`
	routes := `[{"stepSlug": "fetch", "queueName": "step_flow__fetch"}, {"stepSlug": "Store", "queueName": "step_flow__store"}]`

	if st := scalar[string](t, p, `select pgflow.ensure_flow_compiled('Step_Flow', $1::jsonb, 'step', $2::jsonb) ->> 'status'`, shape, routes); st != "compiled" {
		t.Fatalf("first compile: %s", st)
	}
	if q := scalar[string](t, p, `select string_agg(queue_name::text, ',' order by queue_name) from pgmq.list_queues()`); q != "step_flow__fetch,step_flow__store" {
		t.Fatalf("queues %s, want one per step and no flow queue", q)
	}
	if m := scalar[string](t, p, `select queue_mode || ':' || string_agg(s.queue_name, ',' order by s.step_index)
		from pgflow.flows f join pgflow.steps s using (flow_slug) where f.flow_slug = 'Step_Flow' group by queue_mode`); m != "step:step_flow__fetch,step_flow__store" {
		t.Fatalf("stored routes %s", m)
	}
	if st := scalar[string](t, p, `select pgflow.ensure_flow_compiled('Step_Flow', $1::jsonb, 'step', $2::jsonb) ->> 'status'`, shape, routes); st != "verified" {
		t.Fatalf("second compile: %s", st)
	}
	res := scalar[map[string]any](t, p, `select pgflow.ensure_flow_compiled('Step_Flow', $1::jsonb)`, shape)
	if res["status"] != "mismatch" || res["mismatchKind"] != "routing" {
		t.Fatalf("flow-mode compile of a step-mode flow: %v, want a routing mismatch", res)
	}
	_, err := p.Exec(ctx, `select pgflow.ensure_flow_compiled('Step_Flow', $1::jsonb, 'step', '[{"stepSlug": "fetch", "queueName": "x"}]')`, shape)
	if err == nil {
		t.Fatal("a route map that differs from the derived routes was accepted")
	}
	if _, err := p.Exec(ctx, `select pgflow.add_step('Step_Flow', 'extra')`); err == nil {
		t.Fatal("add_step changed a step-mode flow")
	}

	testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'step_flow__fetch', 'fn')`, workerID)
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('Step_Flow', '{"url": "x"}')`)
	ids := scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('step_flow__fetch', 30, 10)`)
	if len(ids) != 1 {
		t.Fatalf("%d messages on the fetch queue, want 1", len(ids))
	}
	if _, err := p.Exec(ctx, `select * from pgflow.start_tasks('Step_Flow', $1, $2::uuid, 'step_flow__fetch')`, ids, workerID); err == nil {
		t.Fatal("a step-mode claim without step_slug was accepted")
	}
	if _, err := p.Exec(ctx, `select * from pgflow.start_tasks('Step_Flow', $1, $2::uuid, 'step_flow__store', 'fetch')`, ids, workerID); err == nil {
		t.Fatal("a claim on a route the flow does not have was accepted")
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('Step_Flow', $1, $2::uuid, 'step_flow__fetch', 'fetch')`, ids, workerID); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	testdb.Exec(t, p, `select pgflow.complete_task($1::uuid, 'fetch', 0, '"page"')`, run)
	ids = scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('step_flow__store', 30, 10)`)
	if len(ids) != 1 {
		t.Fatalf("%d messages on the Store step's queue, want 1", len(ids))
	}
	in := scalar[string](t, p, `select input::text from pgflow.start_tasks('Step_Flow', $1, $2::uuid, 'step_flow__store', 'Store')`, ids, workerID)
	if in != `{"fetch": "page"}` {
		t.Fatalf("Store's input %s", in)
	}
	testdb.Exec(t, p, `select pgflow.complete_task($1::uuid, 'Store', 0, '"saved"')`, run)
	if st := scalar[string](t, p, `select status from pgflow.runs where run_id = $1::uuid`, run); st != "completed" {
		t.Fatalf("run %s", st)
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.step_tasks where queue_name <> case step_slug when 'fetch' then 'step_flow__fetch' else 'step_flow__store' end`); n != 0 {
		t.Fatalf("%d tasks recorded with another queue than their step's", n)
	}

	testdb.Exec(t, p, `select pgflow.delete_flow_and_data('Step_Flow')`)
	if n := scalar[int](t, p, `select count(*) from pgmq.list_queues()`); n != 0 {
		t.Fatalf("%d queues left after delete_flow_and_data", n)
	}
}

// Step queue names: readable when they fit, else by index, never truncated.
func TestStepQueueNames(t *testing.T) {
	db := testdb.Baseline(t)
	applyMigration(t, db.Pool)
	long := strings.Repeat("f", 40)
	for _, c := range []struct{ flow, step, want string }{
		{"Orders", "Pay", "orders__pay"},
		{long, "a_long_step_name", long + "__3"},
	} {
		if got := scalar[string](t, db.Pool, `select pgflow._resolve_step_queue_name($1, $2, 3)`, c.flow, c.step); got != c.want {
			t.Errorf("%s/%s: %s, want %s", c.flow, c.step, got, c.want)
		}
	}
	if _, err := db.Pool.Exec(context.Background(), `select pgflow._resolve_step_queue_name($1, 'x', 0)`, strings.Repeat("f", 46)); err == nil {
		t.Error("a flow slug too long for any step queue was accepted")
	}
	for slug, ok := range map[string]bool{"a": true, "a1_b": true, "_a": false, "a_": false, "a__b": false, "1a": false, "run": false} {
		if got := scalar[bool](t, db.Pool, `select pgflow.is_valid_slug($1)`, slug); got != ok {
			t.Errorf("is_valid_slug(%q) = %v", slug, got)
		}
	}
}

// A 0.16.0 worker on 0.17.0: its two-argument compile resolves through the
// defaults ('verified' for a migrated flow), it registers, and its first
// claim fails with 42883; the task stays queued, nothing is counted.
func TestOldWorkerFailsAtItsFirstClaim(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	p := db.Pool
	testdb.Exec(t, p, `select pgflow.create_flow('Legacy_Flow')`)
	testdb.Exec(t, p, `select pgflow.add_step('Legacy_Flow', 'only')`)
	testdb.Exec(t, p, `select pgflow.start_flow('Legacy_Flow', '{}')`)
	applyMigration(t, p)

	shape := `{"steps": [` + shapeStep("only") + `]}`
	if st := scalar[string](t, p, `select pgflow.ensure_flow_compiled('Legacy_Flow', $1::jsonb) ->> 'status'`, shape); st != "verified" {
		t.Fatalf("0.16.0-style compile of a migrated flow: %s, want verified", st)
	}
	if st := scalar[string](t, p, `select pgflow.ensure_flow_compiled('new_flow', $1::jsonb) ->> 'status'`, shape); st != "compiled" {
		t.Fatalf("0.16.0-style compile of a new flow: %s, want compiled", st)
	}
	testdb.Exec(t, p, `select pgflow.track_worker_function('old-fn')`)
	testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'Legacy_Flow', 'old-fn')`, workerID)
	ids := scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('Legacy_Flow', 5, 10)`)
	_, err := p.Exec(ctx, `select * from pgflow.start_tasks(flow_slug => 'Legacy_Flow', msg_ids => $1, worker_id => $2::uuid)`, ids, workerID)
	if pgCode(err) != "42883" {
		t.Fatalf("0.16.0 claim: %v, want SQLSTATE 42883", err)
	}
	if st := scalar[string](t, p, `select status || '/' || attempts_count from pgflow.step_tasks where flow_slug = 'Legacy_Flow'`); st != "queued/0" {
		t.Fatalf("task %s after the failed claim, want queued/0", st)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.q_legacy_flow where msg_id = any($1)`, ids); n != len(ids) {
		t.Fatalf("%d of %d messages still in the queue", n, len(ids))
	}
}

// Queues are pgflow's own: a new flow whose queue name pgmq already lists is
// refused (23505), and so is a step queue that exists without being the
// flow's route; nothing is created either way.
func TestStrayQueuesAreRefused(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	applyMigration(t, db.Pool)
	p := db.Pool
	testdb.Exec(t, p, `select pgmq.create('stray')`)
	if _, err := p.Exec(ctx, `select pgflow.create_flow('Stray')`); pgCode(err) != "23505" {
		t.Fatalf("create_flow over a listed queue: %v, want 23505", err)
	}
	testdb.Exec(t, p, `select pgmq.create('shop__pay')`)
	shape := `{"steps": [` + shapeStep("pay") + `]}`
	if _, err := p.Exec(ctx, `select pgflow.ensure_flow_compiled('shop', $1::jsonb, 'step', null)`, shape); err == nil {
		t.Fatal("a step queue pgmq lists but no route owns was taken over")
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.flows`); n != 0 {
		t.Fatalf("%d flows created by refused compilations", n)
	}
	if q := scalar[string](t, p, `select string_agg(queue_name::text, ',' order by queue_name) from pgmq.list_queues()`); q != "shop__pay,stray" {
		t.Fatalf("queues %s after the refusals", q)
	}
}

// requeue_stalled_tasks, on the stored queue: a stalled task goes back to
// queued with its message visible three times, then is marked permanently
// stalled. Its message is archived only by a call that also requeues
// something; a call that requeues nothing leaves it in its queue.
func TestRequeueStalledUsesTheStoredQueue(t *testing.T) {
	db := testdb.Baseline(t)
	p := db.Pool
	testdb.Exec(t, p, `select pgflow.create_flow('Slow_Flow', timeout => 1)`)
	testdb.Exec(t, p, `select pgflow.add_step('Slow_Flow', 'only')`)
	testdb.Exec(t, p, `select pgflow.start_flow('Slow_Flow', '{}')`)
	testdb.Exec(t, p, `select pgflow.start_flow('Slow_Flow', '{}')`)
	applyMigration(t, p)
	testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'slow_flow', 'fn')`, workerID)
	stall := func(want int) {
		ids := scalar[[]int64](t, p, `select coalesce(array_agg(msg_id), '{}') from pgmq.read('slow_flow', 30, 10)`)
		if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('Slow_Flow', $1, $2::uuid, 'slow_flow')`, ids, workerID); n != want {
			t.Fatalf("claimed %d, want %d", n, want)
		}
		testdb.Exec(t, p, `update pgflow.step_tasks set queued_at = now() - interval '2 hours', started_at = now() - interval '1 hour' where status = 'started'`)
	}
	for i := 1; i <= 3; i++ {
		stall(2)
		if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 2 {
			t.Fatalf("round %d: requeued %d, want 2", i, n)
		}
		if st := scalar[string](t, p, `select string_agg(status || '/' || requeued_count, ',') from pgflow.step_tasks`); st != fmt.Sprintf("queued/%d,queued/%d", i, i) {
			t.Fatalf("round %d: tasks %s", i, st)
		}
	}
	stall(2)
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 0 {
		t.Fatalf("requeued %d after three requeues, want 0", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.step_tasks where permanently_stalled_at is not null and status = 'started'`); n != 2 {
		t.Fatalf("%d tasks permanently stalled, want 2", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.a_slow_flow`); n != 0 {
		t.Fatalf("%d messages archived by a call that requeued nothing, want 0", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.q_slow_flow`); n != 2 {
		t.Fatalf("%d messages left in the queue, want both", n)
	}
	// A later call skips the stalled tasks: their messages stay.
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 0 {
		t.Fatalf("requeued %d, want 0", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.q_slow_flow`); n != 2 {
		t.Fatalf("%d messages left in the queue, want both", n)
	}

	// A call that requeues one task archives the messages of the tasks it
	// marks permanently stalled in the same call.
	testdb.Exec(t, p, `update pgflow.step_tasks set permanently_stalled_at = null, requeued_count = 3`)
	testdb.Exec(t, p, `update pgflow.step_tasks set requeued_count = 0
	             where task_index = 0 and run_id = (select min(run_id::text)::uuid from pgflow.step_tasks)`)
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 1 {
		t.Fatalf("requeued %d, want 1", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.a_slow_flow`); n != 1 {
		t.Fatalf("%d messages archived, want the stalled task's one", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.q_slow_flow q join pgflow.step_tasks t on t.message_id = q.msg_id
	                            where t.status = 'queued' and q.vt <= now()`); n != 1 {
		t.Fatalf("%d requeued messages visible, want 1", n)
	}
}

// On a local database a changed definition is recompiled: here a migrated
// flow-mode flow moves to step mode, and its one queue makes way for the
// step queues; elsewhere the same call is a shape or routing mismatch.
func TestLocalRecompileMovesAFlowToStepMode(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	p := db.Pool
	testdb.Exec(t, p, `select pgflow.create_flow('Moving')`)
	testdb.Exec(t, p, `select pgflow.add_step('Moving', 'a')`)
	applyMigration(t, p)
	shape := `{"steps": [` + shapeStep("a") + `]}`
	changed := `{"steps": [` + shapeStep("a") + `, ` + shapeStep("b", "a") + `]}`
	if k := scalar[string](t, p, `select pgflow.ensure_flow_compiled('Moving', $1::jsonb) ->> 'mismatchKind'`, changed); k != "shape" {
		t.Fatalf("a changed shape in production: mismatchKind %q, want shape", k)
	}
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := session.SetLocal(ctx, tx, "app.settings.jwt_secret", "super-secret-jwt-token-with-at-least-32-characters-long"); err != nil {
		t.Fatal(err)
	}
	if st := scalar[string](t, tx, `select pgflow.ensure_flow_compiled('Moving', $1::jsonb, 'step') ->> 'status'`, shape); st != "recompiled" {
		t.Fatalf("local recompile into step mode: %s", st)
	}
	if q := scalar[string](t, tx, `select string_agg(queue_name::text, ',' order by queue_name) from pgmq.list_queues()`); q != "moving__a" {
		t.Fatalf("queues after the recompile %q, want only the step queue", q)
	}
	if m := scalar[string](t, tx, `select queue_mode from pgflow.flows where flow_slug = 'Moving'`); m != "step" {
		t.Fatalf("queue_mode %s", m)
	}
}
