package migrations_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// events returns the names of the broadcasts recorded for a run, in order.
func events(t *testing.T, p q, run string) []string {
	t.Helper()
	return scalar[[]string](t, p, `select coalesce(array_agg(b.event order by b.id), '{}') from realtime.recorded_broadcasts b
		where b.topic = 'pgflow:run:' || $1`, run)
}

// claimAndComplete reads a queue, claims what it read and completes each
// claimed task with output.
func claimAndComplete(t *testing.T, p q, flow, queue, step, output string) {
	t.Helper()
	ids := scalar[[]int64](t, p, `select coalesce(array_agg(msg_id), '{}') from pgmq.read($1, 30, 100)`, queue)
	args := []any{flow, ids, workerID, queue}
	sql := `select run_id::text, step_slug, task_index from pgflow.start_tasks($1, $2, $3::uuid, $4)`
	if step != "" {
		sql = `select run_id::text, step_slug, task_index from pgflow.start_tasks($1, $2, $3::uuid, $4, $5)`
		args = append(args, step)
	}
	rows, err := p.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	type task struct {
		Run, Step string
		Index     int
	}
	tasks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[task])
	if err != nil || len(tasks) == 0 {
		t.Fatalf("claiming on %s: %v (%d tasks)", queue, err, len(tasks))
	}
	for _, k := range tasks {
		testdb.Exec(t, p, `select count(*) from pgflow.complete_task($1::uuid, $2, $3, $4::jsonb)`, k.Run, k.Step, k.Index, output)
	}
}

// The 0.17.0 engine's behaviour beyond its errors, on databases upgraded by
// both paths.
func TestBehaviourAsUpstream017(t *testing.T) {
	onEachPath(t, func(t *testing.T, p *pgxpool.Pool) {
		testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'any', 'fn')`, workerID)
		t.Run("differences and mismatchKind", func(t *testing.T) { testDifferences(t, p) })
		t.Run("skips of one completion: plain skip first, each cascade as it becomes ready", func(t *testing.T) { testConditionSkipOrder(t, p) })
		t.Run("start_ready_steps: slug order, every start before any message", func(t *testing.T) { testStartOrder(t, p) })
		t.Run("force skip archives the first non-empty queue only", func(t *testing.T) { testForceSkipArchive(t, p) })
		t.Run("force skip broadcasts in dependency order on a populated database", func(t *testing.T) { testForceSkipOrderPopulated(t, p) })
		t.Run("fail_task on a queued task pushes its message back", func(t *testing.T) { testFailQueued(t, p) })
		t.Run("delete_flow_and_data on a dropped step queue rolls back", func(t *testing.T) { testDeleteMissingQueue(t, p) })
		t.Run("definition writers", func(t *testing.T) { testDefinitionWriters(t, p) })
		t.Run("cascade_resolve_conditions runs 50 iterations", func(t *testing.T) { testFiftyIterations(t, p) })
		t.Run("requeue_stalled_tasks touches messages only when it requeued something", func(t *testing.T) { testRequeueMessages(t, p) })
		t.Run("start_tasks locks only what it claims", func(t *testing.T) { testClaimLocks(t, p) })
		t.Run("fail_task: a skip whose conditions fail the run", func(t *testing.T) { testSkipThenConditionFails(t, p) })
	})
}

func testDifferences(t *testing.T, p *pgxpool.Pool) {
	compile := func(db q, flow, shape string, mode any) map[string]any {
		t.Helper()
		return scalar[map[string]any](t, db, `select pgflow.ensure_flow_compiled($1, $2::jsonb, $3)`, flow, shape, mode)
	}
	etl := shapeJSON(stepJSON("extract", "single"), stepJSON("transform", "single", "extract"), stepJSON("load", "single", "transform"))
	if got := compile(p, "etl_pipeline", etl, nil); !reflect.DeepEqual(got, map[string]any{"status": "compiled", "differences": []any{}, "mismatchKind": nil}) {
		t.Fatalf("first compile (NULL mode = flow mode): %v", got)
	}
	if m := scalar[string](t, p, `select queue_mode from pgflow.flows where flow_slug = 'etl_pipeline'`); m != "flow" {
		t.Fatalf("NULL mode compiled as %s", m)
	}
	withOptions := `{"options": {"maxAttempts": 9, "timeout": 99}, "steps": [` +
		stepJSON("extract", "single") + `, ` + stepJSON("transform", "single", "extract") + `, ` + stepJSON("load", "single", "transform") + `]}`
	if got := compile(p, "etl_pipeline", withOptions, "flow"); got["status"] != "verified" {
		t.Fatalf("options are not compared: %v", got)
	}
	more := shapeJSON(stepJSON("extract", "single"), stepJSON("transform", "single", "extract"), stepJSON("load", "single", "transform"),
		stepJSON("extra", "single", "load"))
	want := map[string]any{"status": "mismatch", "mismatchKind": "shape", "differences": []any{
		"Step count differs: 4 vs 3",
		"Step at index 3: missing in second shape (first has 'extra')",
		"Step routes differ: database has [extract -> etl_pipeline, transform -> etl_pipeline, load -> etl_pipeline], worker expects [extract -> etl_pipeline, transform -> etl_pipeline, load -> etl_pipeline, extra -> etl_pipeline]",
	}}
	if got := compile(p, "etl_pipeline", more, "flow"); !reflect.DeepEqual(got, want) {
		t.Fatalf("a step more:\n got %v\nwant %v", got, want)
	}

	// Per index: slug, type, dependencies, then the patterns as jsonb text;
	// a key missing on one side (whenUnmet here) reports nothing.
	compile(p, "pat", shapeJSON(stepJSON("a", "single"), stepJSON("b", "single", "a")), "flow")
	worker := `{"steps": [{"slug": "a", "stepType": "single", "dependencies": [], "whenExhausted": "fail",
		"requiredInputPattern": {"defined": true, "value": {"tier": "premium"}}, "forbiddenInputPattern": {"defined": false}},
		` + stepJSON("c", "map", "a") + `]}`
	want = map[string]any{"status": "mismatch", "mismatchKind": "shape", "differences": []any{
		`Step at index 0: requiredInputPattern differs '{"value": {"tier": "premium"}, "defined": true}' vs '{"defined": false}'`,
		"Step at index 1: slug differs 'c' vs 'b'",
		"Step at index 1: type differs 'map' vs 'single'",
		"Step routes differ: database has [a -> pat, b -> pat], worker expects [a -> pat, c -> pat]",
	}}
	if got := compile(p, "pat", worker, "flow"); !reflect.DeepEqual(got, want) {
		t.Fatalf("changed steps:\n got %v\nwant %v", got, want)
	}

	gate := shapeJSON(stepJSON("standard_report", "single"), stepJSON("premium_report", "single"))
	compile(p, "gate_flow", gate, "flow")
	want = map[string]any{"status": "mismatch", "mismatchKind": "routing", "differences": []any{
		"Queue mode differs: database has 'flow', worker expects 'step'",
		"Step routes differ: database has [standard_report -> gate_flow, premium_report -> gate_flow], worker expects [standard_report -> gate_flow__standard_report, premium_report -> gate_flow__premium_report]",
	}}
	if got := compile(p, "gate_flow", gate, "step"); !reflect.DeepEqual(got, want) {
		t.Fatalf("step mode on a flow-mode flow:\n got %v\nwant %v", got, want)
	}

	// A local database recompiles, reporting the same differences.
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := session.SetLocal(ctx, tx, "app.settings.jwt_secret", "super-secret-jwt-token-with-at-least-32-characters-long"); err != nil {
		t.Fatal(err)
	}
	want["status"], want["mismatchKind"] = "recompiled", nil
	if got := compile(tx, "gate_flow", gate, "step"); !reflect.DeepEqual(got, want) {
		t.Fatalf("local recompile:\n got %v\nwant %v", got, want)
	}
}

func testConditionSkipOrder(t *testing.T, p *pgxpool.Pool) {
	for _, s := range []string{
		`select pgflow.create_flow('conds')`,
		`select pgflow.add_step('conds', 'root')`,
		`select pgflow.add_step('conds', 'a_skip', array['root'], required_input_pattern => '{"root": {"ok": true}}')`,
		`select pgflow.add_step('conds', 'b_casc', array['a_skip'], required_input_pattern => '{"a_skip": {}}', when_unmet => 'skip-cascade')`,
		`select pgflow.add_step('conds', 'b_child', array['b_casc'])`,
		`select pgflow.add_step('conds', 'c_casc', array['root'], required_input_pattern => '{"root": {"ok": true}}', when_unmet => 'skip-cascade')`,
		`select pgflow.add_step('conds', 'c_child', array['c_casc'])`,
	} {
		testdb.Exec(t, p, s)
	}
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('conds', '{}')`)
	claimAndComplete(t, p, "conds", "conds", "", `{"ok": false}`)
	got := events(t, p, run)
	want := []string{"run:started", "step:root:started", "step:root:completed",
		"step:a_skip:skipped", "step:b_casc:skipped", "step:b_child:skipped", "step:c_casc:skipped", "step:c_child:skipped",
		"run:completed"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	reasons := scalar[string](t, p, `select string_agg(step_slug || '=' || skip_reason, ',' order by step_slug) from pgflow.step_states
		where run_id = $1::uuid and status = 'skipped'`, run)
	if reasons != "a_skip=condition_unmet,b_casc=condition_unmet,b_child=dependency_skipped,c_casc=condition_unmet,c_child=dependency_skipped" {
		t.Fatalf("skip reasons %s", reasons)
	}
	// A run that does not exist is no error to cascade_resolve_conditions.
	if !scalar[bool](t, p, `select pgflow.cascade_resolve_conditions('`+missingRunID+`')`) {
		t.Fatal("cascade_resolve_conditions on a missing run: false, want true")
	}
}

func testStartOrder(t *testing.T, p *pgxpool.Pool) {
	for _, s := range []string{
		`select pgflow.create_flow('fanout')`,
		`select pgflow.add_step('fanout', 'root')`,
		`select pgflow.add_step('fanout', 'zeta', array['root'])`,
		`select pgflow.add_step('fanout', 'alpha', array['root'])`,
		`select pgflow.add_step('fanout', 'mid', array['root'], step_type => 'map')`,
	} {
		testdb.Exec(t, p, s)
	}
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('fanout', '{}')`)
	claimAndComplete(t, p, "fanout", "fanout", "", `[1, 2]`)
	got := events(t, p, run)
	want := []string{"run:started", "step:root:started", "step:root:completed", "step:alpha:started", "step:mid:started", "step:zeta:started"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	order := scalar[string](t, p, `select string_agg(step_slug || task_index, ',' order by message_id) from pgflow.step_tasks
		where run_id = $1::uuid and step_slug <> 'root'`, run)
	if order != "alpha0,mid0,mid1,zeta0" {
		t.Fatalf("messages sent in the order %s, want by slug then task index", order)
	}
}

func testForceSkipArchive(t *testing.T, p *pgxpool.Pool) {
	shape := shapeJSON(stepJSON("r", "single"), stepJSON("x", "single", "r"), stepJSON("y", "single", "r"), stepJSON("z", "single", "r"))
	testdb.Exec(t, p, `select pgflow.ensure_flow_compiled('fan', $1::jsonb, 'step')`, shape)
	live := func(run string) string {
		return scalar[string](t, p, `select string_agg(t.step_slug || '=' || case
				when exists (select 1 from pgmq.q_fan__x q where t.queue_name = 'fan__x' and q.msg_id = t.message_id)
				  or exists (select 1 from pgmq.q_fan__y q where t.queue_name = 'fan__y' and q.msg_id = t.message_id)
				  or exists (select 1 from pgmq.q_fan__z q where t.queue_name = 'fan__z' and q.msg_id = t.message_id) then 'live'
				else 'archived' end, ',' order by t.step_slug)
			from pgflow.step_tasks t where t.run_id = $1::uuid and t.step_slug <> 'r'`, run)
	}
	for _, preArchived := range []bool{false, true} {
		run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('fan', '{}')`)
		claimAndComplete(t, p, "fan", "fan__r", "r", `"done"`)
		want := "x=archived,y=live,z=live"
		if preArchived {
			testdb.Exec(t, p, `select pgmq.archive('fan__x', (select message_id from pgflow.step_tasks where run_id = $1::uuid and step_slug = 'x'))`, run)
			want = "x=archived,y=archived,z=live"
		}
		if n := scalar[int](t, p, `select pgflow._cascade_force_skip_steps($1::uuid, 'r', 'manual')`, run); n != 3 {
			t.Fatalf("skipped %d, want the three started dependents", n)
		}
		if st := scalar[string](t, p, `select string_agg(distinct status, ',') from pgflow.step_tasks where run_id = $1::uuid and step_slug <> 'r'`, run); st != "skipped" {
			t.Fatalf("dependents' tasks %s, want all skipped", st)
		}
		if got := live(run); got != want {
			t.Fatalf("pre-archived %v: messages %s, want %s", preArchived, got, want)
		}
	}
}

func testFailQueued(t *testing.T, p *pgxpool.Pool) {
	testdb.Exec(t, p, `select pgflow.create_flow('retry_later', base_delay => 7)`)
	testdb.Exec(t, p, `select pgflow.add_step('retry_later', 'only')`)
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('retry_later', '{}')`)
	row := scalar[string](t, p, `select status || '/' || attempts_count || '/' || coalesce(error_message, '-')
		from pgflow.fail_task($1::uuid, 'only', 0, 'not mine')`, run)
	if row != "queued/0/-" {
		t.Fatalf("task %s, want unchanged queued/0/-", row)
	}
	secs := scalar[float64](t, p, `select extract(epoch from q.vt - now())::float8 from pgmq.q_retry_later q
		join pgflow.step_tasks t on t.message_id = q.msg_id where t.run_id = $1::uuid`, run)
	if secs < 6 || secs > 8 {
		t.Fatalf("message visible in %.1f s, want pushed back by calculate_retry_delay(7, 0) = 7 s", secs)
	}
}

func testDeleteMissingQueue(t *testing.T, p *pgxpool.Pool) {
	testdb.Exec(t, p, `select pgflow.ensure_flow_compiled('doomed_steps', $1::jsonb, 'step')`, shapeJSON(stepJSON("a", "single"), stepJSON("b", "single")))
	testdb.Exec(t, p, `select pgmq.drop_queue('doomed_steps__b')`)
	if scalar[bool](t, p, `select coalesce((select pg_catalog.string_to_array(extversion, '.')::int[] > '{1,5,1}' from pg_catalog.pg_extension where extname = 'pgmq'), false)`) {
		// From pgmq 1.5.2 drop_queue returns false on a missing queue:
		// upstream's deletion then goes through, and so does this one.
		testdb.Exec(t, p, `select pgflow.delete_flow_and_data('doomed_steps')`)
		if n := scalar[int](t, p, `select (select count(*) from pgflow.steps where flow_slug = 'doomed_steps')
			+ (select count(*) from pgmq.list_queues() where queue_name like 'doomed_steps%')`); n != 0 {
			t.Fatalf("the deletion on a later pgmq left %d steps and queues", n)
		}
		return
	}
	if _, err := p.Exec(context.Background(), `select pgflow.delete_flow_and_data('doomed_steps')`); pgCode(err) != "42P01" {
		t.Fatalf("delete with a dropped step queue: %v, want 42P01", err)
	}
	if n := scalar[int](t, p, `select (select count(*) from pgflow.steps where flow_slug = 'doomed_steps')
		+ (select count(*) from pgmq.list_queues() where queue_name = 'doomed_steps__a')`); n != 3 {
		t.Fatal("the failed deletion changed something")
	}
}

func testDefinitionWriters(t *testing.T, p *pgxpool.Pool) {
	// add_step: a NULL step_type is a single step; an existing step is
	// returned unchanged.
	testdb.Exec(t, p, `select pgflow.create_flow('defs')`)
	if ty := scalar[string](t, p, `select step_type from pgflow.add_step('defs', 'a', step_type => null)`); ty != "single" {
		t.Fatalf("NULL step_type stored as %s", ty)
	}
	if got := scalar[string](t, p, `select coalesce(opt_timeout::text, '-') || '/' || step_index from pgflow.add_step('defs', 'a', timeout => 5)`); got != "-/0" {
		t.Fatalf("re-adding a step changed it: %s", got)
	}
	// Step mode: a repeated dependency is stored once and counted twice.
	testdb.Exec(t, p, `select pgflow.ensure_flow_compiled('dupdeps', $1::jsonb, 'step')`,
		shapeJSON(stepJSON("a", "single"), stepJSON("b", "single", "a", "a")))
	if got := scalar[string](t, p, `select s.deps_count || '/' || (select count(*) from pgflow.deps d where d.flow_slug = 'dupdeps')
		from pgflow.steps s where s.flow_slug = 'dupdeps' and s.step_slug = 'b'`); got != "2/1" {
		t.Fatalf("deps_count/deps rows %s, want 2/1", got)
	}
	// start_tasks's settings: search_path first, then plan_cache_mode.
	cfg := scalar[[]string](t, p, `select proconfig from pg_proc where oid = 'pgflow.start_tasks(text, bigint[], uuid, text, text)'::regprocedure`)
	if !reflect.DeepEqual(cfg, []string{`search_path=""`, "plan_cache_mode=force_custom_plan"}) {
		t.Fatalf("start_tasks proconfig %q", cfg)
	}
	// The compile result has exactly three keys.
	var keys []string
	raw := scalar[string](t, p, `select pgflow.ensure_flow_compiled('defs2', $1::jsonb)::text`, shapeJSON(stepJSON("a", "single")))
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	for k := range m {
		keys = append(keys, k)
	}
	if len(keys) != 3 || string(m["mismatchKind"]) != "null" {
		t.Fatalf("compile result %s", raw)
	}
}

// 49 steps skipped one per iteration take 50 iterations (the last finds
// nothing): within the limit, the run completes. (50 such steps need a 51st
// iteration: the error case E4.)
func testFiftyIterations(t *testing.T, p *pgxpool.Pool) {
	testdb.Exec(t, p, `select pgflow.create_flow('chain49')`)
	testdb.Exec(t, p, `select pgflow.add_step('chain49', 's' || i, case when i = 0 then '{}' else array['s' || (i - 1)] end,
		required_input_pattern => '{"go": true}') from generate_series(0, 48) i`)
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('chain49', '{}')`)
	if st := scalar[string](t, p, `select status || ' ' || (select count(*) from pgflow.step_states s where s.run_id = r.run_id and s.status = 'skipped')
		from pgflow.runs r where r.run_id = $1::uuid`, run); st != "completed 49" {
		t.Fatalf("run %s, want completed with 49 skipped steps", st)
	}
}

// Permanently stalled tasks: a call that requeues nothing marks them and
// leaves their messages in the queue; a call that requeues one task also
// archives the messages of those it marks.
func testRequeueMessages(t *testing.T, p *pgxpool.Pool) {
	testdb.Exec(t, p, `select pgflow.create_flow('stalls', timeout => 1)`)
	testdb.Exec(t, p, `select pgflow.add_step('stalls', 'only')`)
	runs := []string{
		scalar[string](t, p, `select run_id::text from pgflow.start_flow('stalls', '{}')`),
		scalar[string](t, p, `select run_id::text from pgflow.start_flow('stalls', '{}')`),
		scalar[string](t, p, `select run_id::text from pgflow.start_flow('stalls', '{}')`),
	}
	ids := scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('stalls', 30, 10)`)
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('stalls', $1, $2::uuid, 'stalls')`, ids, workerID); n != 3 {
		t.Fatalf("claimed %d, want 3", n)
	}
	// Runs 0 and 1 have used up their requeues; run 2 has not.
	testdb.Exec(t, p, `update pgflow.step_tasks set queued_at = now() - interval '2 hours', started_at = now() - interval '1 hour',
		requeued_count = case when run_id = $1::uuid then 0 else 3 end where flow_slug = 'stalls'`, runs[2])
	stalledLive := `select count(*) from pgmq.q_stalls q join pgflow.step_tasks t on t.message_id = q.msg_id and t.queue_name = 'stalls'
		where t.permanently_stalled_at is not null`

	// Only permanent ones (run 2's task held by another transaction is skipped).
	ctx := context.Background()
	hold, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testdb.Exec(t, hold, `select 1 from pgflow.step_tasks where run_id = $1::uuid for update`, runs[2])
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 0 {
		t.Fatalf("requeued %d, want 0", n)
	}
	_ = hold.Rollback(ctx)
	if n := scalar[int](t, p, stalledLive); n != 2 {
		t.Fatalf("%d permanently stalled tasks' messages left in the queue, want 2 (nothing requeued)", n)
	}
	// A call that requeues run 2's task: it finds no new permanent ones,
	// the two marked before stay as they are.
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 1 {
		t.Fatalf("requeued %d, want 1", n)
	}
	if n := scalar[int](t, p, stalledLive); n != 2 {
		t.Fatalf("%d stalled messages live, want 2: later calls skip marked tasks", n)
	}
	// Unmark one, and stall run 2's task again: requeued and marked together.
	testdb.Exec(t, p, `update pgflow.step_tasks set permanently_stalled_at = null where run_id = $1::uuid`, runs[0])
	ids = scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('stalls', 30, 10)`)
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('stalls', $1, $2::uuid, 'stalls')`, ids, workerID); n != 1 {
		t.Fatalf("claimed %d, want run 2's task", n)
	}
	testdb.Exec(t, p, `update pgflow.step_tasks set started_at = now() - interval '1 hour' where run_id = $1::uuid`, runs[2])
	if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 1 {
		t.Fatalf("requeued %d, want 1", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.a_stalls a join pgflow.step_tasks t on t.message_id = a.msg_id
		where t.run_id = $1::uuid`, runs[0]); n != 1 {
		t.Fatal("the task marked together with a requeue kept its message")
	}
	if n := scalar[int](t, p, stalledLive); n != 1 {
		t.Fatalf("%d stalled messages live, want run 1's only", n)
	}
}

// A claim does not wait for a row it would not claim: a started task's row
// held by another transaction (its worker reporting, say) does not block a
// claim that names its message next to a queued one.
func testClaimLocks(t *testing.T, p *pgxpool.Pool) {
	ctx := context.Background()
	testdb.Exec(t, p, `select pgflow.create_flow('locks')`)
	testdb.Exec(t, p, `select pgflow.add_step('locks', 'a')`)
	testdb.Exec(t, p, `select pgflow.start_flow('locks', '{}')`)
	testdb.Exec(t, p, `select pgflow.start_flow('locks', '{}')`)
	ids := scalar[[]int64](t, p, `select array_agg(msg_id order by msg_id) from pgmq.read('locks', 30, 10)`)
	if len(ids) != 2 {
		t.Fatalf("read %d messages, want 2", len(ids))
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('locks', $1, $2::uuid, 'locks')`, ids[:1], workerID); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	hold, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback(ctx)
	testdb.Exec(t, hold, `select 1 from pgflow.step_tasks where queue_name = 'locks' and message_id = $1 for update`, ids[0])

	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	testdb.Exec(t, tx, `set local lock_timeout = '2s'`)
	got := scalar[[]int64](t, tx, `select coalesce(array_agg(msg_id), '{}') from pgflow.start_tasks('locks', $1, $2::uuid, 'locks')`, ids, workerID)
	if len(got) != 1 || got[0] != ids[1] {
		t.Fatalf("claimed %v, want only the queued task's message %d", got, ids[1])
	}
}

// An exhausted 'skip' step whose dependent's 'fail' condition is then unmet:
// step:skipped from fail_task, then step:failed and run:failed from the
// conditions, and no second run:failed; the task's message is archived.
func testSkipThenConditionFails(t *testing.T, p *pgxpool.Pool) {
	testdb.Exec(t, p, `select pgflow.create_flow('skipfail', max_attempts => 1)`)
	testdb.Exec(t, p, `select pgflow.add_step('skipfail', 's1', when_exhausted => 'skip')`)
	testdb.Exec(t, p, `select pgflow.add_step('skipfail', 'gate', array['s1'], required_input_pattern => '{"s1": {}}', when_unmet => 'fail')`)
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('skipfail', '{}')`)
	ids := scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('skipfail', 30, 10)`)
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('skipfail', $1, $2::uuid, 'skipfail')`, ids, workerID); n != 1 {
		t.Fatalf("claimed %d, want 1", n)
	}
	row := scalar[string](t, p, `select status from pgflow.fail_task($1::uuid, 's1', 0, 'broken')`, run)
	if row != "failed" {
		t.Fatalf("task %s, want failed", row)
	}
	want := []string{"run:started", "step:s1:started", "step:s1:skipped", "step:gate:failed", "run:failed"}
	if got := events(t, p, run); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	if n := scalar[int](t, p, `select count(*) from pgmq.a_skipfail where msg_id = $1`, ids[0]); n != 1 {
		t.Fatal("the failed task's message was not archived")
	}
}

// testForceSkipOrderPopulated: _cascade_force_skip_steps broadcasts
// step:skipped in dependency order (the trigger, then its dependents by
// step_index) on a populated, analysed database, where the planner reads
// the run's rows in physical order. The slugs are chosen so that neither
// slug order (k, m, x) nor the physical order (x and k untouched since
// start_flow, m moved by its start) is dependency order (m, x, k).
func testForceSkipOrderPopulated(t *testing.T, p *pgxpool.Pool) {
	for _, s := range []string{
		`select pgflow.create_flow('deporder')`,
		`select pgflow.add_step('deporder', 'r')`,
		`select pgflow.add_step('deporder', 'm', array['r'])`,
		`select pgflow.add_step('deporder', 'x', array['m'])`,
		`select pgflow.add_step('deporder', 'k', array['m'])`,
	} {
		testdb.Exec(t, p, s)
	}
	run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('deporder', '{}')`)
	claimAndComplete(t, p, "deporder", "deporder", "", `"done"`)
	// Populated: many runs' step_states, statistics gathered.
	testdb.Exec(t, p, `select count(*) from generate_series(1, 300) i, pgflow.start_flow('deporder', '{}')`)
	testdb.Exec(t, p, `analyze pgflow.step_states; analyze pgflow.steps; analyze pgflow.deps; analyze pgflow.runs`)
	if n := scalar[int](t, p, `select pgflow._cascade_force_skip_steps($1::uuid, 'm', 'manual')`, run); n != 3 {
		t.Fatalf("skipped %d, want m and its two dependents", n)
	}
	got := events(t, p, run)
	want := []string{"run:started", "step:r:started", "step:r:completed", "step:m:started",
		"step:m:skipped", "step:x:skipped", "step:k:skipped"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}
