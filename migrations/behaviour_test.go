package migrations_test

// The differential test: the same operations on real pgflow 0.16.0 and on
// a database upgraded mid-way by the migration give the same states, queue
// contents and realtime events, since pgflow 0.17.0 keeps a migrated flow's
// behaviour (every step still on the flow's one queue), with the claim made
// through each version's start_tasks.

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

const workerID = "00000000-0000-0000-0000-0000000000aa"

func runID(n int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", n) }

// engine drives one database; v17 says which start_tasks to call.
type engine struct {
	t    *testing.T
	db   *pgxpool.Pool
	v17  bool
	held []claimed // tasks a handler kept (neither completed nor failed)
}

type claimed struct {
	Flow, Run, Step string
	Index           int
	MsgID           int64
	Input           json.RawMessage
}

// taskOutcome is what a handler did: complete with output, fail with an error, or hold.
type taskOutcome struct {
	output string
	fail   string
	hold   bool
}

// claim reads every visible message of a flow's queue and claims them the
// way that version's worker does.
func (e *engine) claim(flow string) []claimed {
	e.t.Helper()
	ctx := context.Background()
	queue := strings.ToLower(flow)
	ids := scalar[[]int64](e.t, e.db, `select coalesce(array_agg(msg_id order by msg_id), '{}') from pgmq.read($1, 30, 100)`, queue)
	if len(ids) == 0 {
		return nil
	}
	sql := `select flow_slug, run_id::text, step_slug, task_index, msg_id, input from pgflow.start_tasks($1, $2, $3::uuid)`
	args := []any{flow, ids, workerID}
	if e.v17 {
		sql = `select flow_slug, run_id::text, step_slug, task_index, msg_id, input
		         from pgflow.start_tasks(flow_slug => $1, msg_ids => $2, worker_id => $3::uuid, queue_name => $4)`
		args = append(args, queue)
	}
	rows, err := e.db.Query(ctx, sql, args...)
	if err != nil {
		e.t.Fatalf("start_tasks(%s): %v", flow, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed, error) {
		var c claimed
		err := r.Scan(&c.Flow, &c.Run, &c.Step, &c.Index, &c.MsgID, &c.Input)
		return c, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].MsgID < out[j].MsgID })
	return out
}

// drain claims and handles a flow's messages until none is visible.
func (e *engine) drain(flow string, handle func(c claimed) taskOutcome) {
	e.t.Helper()
	for i := 0; i < 20; i++ {
		tasks := e.claim(flow)
		if len(tasks) == 0 {
			return
		}
		for _, c := range tasks {
			e.finish(c, handle(c))
		}
	}
	e.t.Fatalf("%s: still claiming after 20 rounds", flow)
}

func (e *engine) finish(c claimed, o taskOutcome) {
	e.t.Helper()
	switch {
	case o.hold:
		e.held = append(e.held, c)
	case o.fail != "":
		testdb.Exec(e.t, e.db, `select count(*) from pgflow.fail_task($1::uuid, $2, $3, $4)`, c.Run, c.Step, c.Index, o.fail)
	default:
		testdb.Exec(e.t, e.db, `select count(*) from pgflow.complete_task($1::uuid, $2, $3, $4::jsonb)`, c.Run, c.Step, c.Index, o.output)
	}
}

// define builds the scenario's flows with the 0.16.0 definition API.
func define(t *testing.T, db q) {
	for _, s := range []string{
		`select pgflow.create_flow('Chain_Flow')`,
		`select pgflow.add_step('Chain_Flow', 'first')`,
		`select pgflow.add_step('Chain_Flow', 'items', array['first'], step_type => 'map')`,
		`select pgflow.add_step('Chain_Flow', 'total', array['items'])`,
		`select pgflow.create_flow('retry_flow', max_attempts => 2, base_delay => 0)`,
		`select pgflow.add_step('retry_flow', 'flaky')`,
		`select pgflow.create_flow('doomed', max_attempts => 2, base_delay => 0)`,
		`select pgflow.add_step('doomed', 'a')`,
		`select pgflow.add_step('doomed', 'b')`,
		`select pgflow.create_flow('cond_flow')`,
		`select pgflow.add_step('cond_flow', 'check')`,
		`select pgflow.add_step('cond_flow', 'needs_ok', array['check'], required_input_pattern => '{"check": {"ok": true}}')`,
		`select pgflow.add_step('cond_flow', 'after', array['needs_ok'])`,
		`select pgflow.add_step('cond_flow', 'cascade_me', array['check'], forbidden_input_pattern => '{"check": {"ok": false}}', when_unmet => 'skip-cascade')`,
		`select pgflow.add_step('cond_flow', 'below', array['cascade_me'])`,
		`select pgflow.create_flow('cond_fail')`,
		`select pgflow.add_step('cond_fail', 'gate', required_input_pattern => '{"go": true}', when_unmet => 'fail')`,
		`select pgflow.create_flow('skippy', max_attempts => 1)`,
		`select pgflow.add_step('skippy', 's1', when_exhausted => 'skip')`,
		`select pgflow.add_step('skippy', 's2', array['s1'])`,
		`select pgflow.add_step('skippy', 'c1', when_exhausted => 'skip-cascade')`,
		`select pgflow.add_step('skippy', 'c2', array['c1'])`,
		`select pgflow.create_flow('typeviol')`,
		`select pgflow.add_step('typeviol', 'src')`,
		`select pgflow.add_step('typeviol', 'fan', array['src'], step_type => 'map')`,
		`select pgflow.add_step('typeviol', 'other')`,
		`select pgflow.create_flow('stall_flow')`,
		`select pgflow.add_step('stall_flow', 'slow')`,
	} {
		testdb.Exec(t, db, s)
	}
	testdb.Exec(t, db, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'any', 'fn')`, workerID)
}

// scenario runs the operations after the (possible) upgrade.
func (e *engine) scenario() {
	t, db := e.t, e.db
	// The chain run started before the upgrade continues.
	e.drain("Chain_Flow", func(c claimed) taskOutcome {
		switch c.Step {
		case "first":
			return taskOutcome{output: `[1, 2, 3]`}
		case "items":
			return taskOutcome{output: string(c.Input) + "0"}
		}
		return taskOutcome{output: `"done"`}
	})
	testdb.Exec(t, db, `select pgflow.start_flow('retry_flow', '{}', $1::uuid)`, runID(2))
	tries := 0
	e.drain("retry_flow", func(c claimed) taskOutcome {
		if tries++; tries == 1 {
			return taskOutcome{fail: "transient"}
		}
		return taskOutcome{output: `{"ok": 1}`}
	})
	testdb.Exec(t, db, `select pgflow.start_flow('doomed', '{}', $1::uuid)`, runID(3))
	e.drain("doomed", func(c claimed) taskOutcome {
		if c.Step == "b" {
			return taskOutcome{hold: true}
		}
		return taskOutcome{fail: "always"}
	})
	for _, c := range e.held { // late reports after the run failed
		e.finish(c, taskOutcome{output: `"late"`})
	}
	e.held = nil
	testdb.Exec(t, db, `select pgflow.start_flow('cond_flow', '{}', $1::uuid)`, runID(4))
	e.drain("cond_flow", func(c claimed) taskOutcome {
		if c.Step == "check" {
			return taskOutcome{output: `{"ok": false}`}
		}
		return taskOutcome{output: `"ran"`}
	})
	testdb.Exec(t, db, `select pgflow.start_flow('cond_fail', '{"go": false}', $1::uuid)`, runID(5))
	testdb.Exec(t, db, `select pgflow.start_flow('skippy', '{}', $1::uuid)`, runID(6))
	e.drain("skippy", func(c claimed) taskOutcome {
		if c.Step == "s1" || c.Step == "c1" {
			return taskOutcome{fail: "broken " + c.Step}
		}
		return taskOutcome{output: `"ok"`}
	})
	testdb.Exec(t, db, `select pgflow.start_flow('typeviol', '{}', $1::uuid)`, runID(7))
	e.drain("typeviol", func(c claimed) taskOutcome {
		if c.Step == "src" {
			return taskOutcome{output: `{"not": "an array"}`}
		}
		return taskOutcome{hold: true}
	})
	e.held = nil
	testdb.Exec(t, db, `select pgflow.start_flow('stall_flow', '{}', $1::uuid)`, runID(8))
	e.drain("stall_flow", func(claimed) taskOutcome { return taskOutcome{hold: true} })
	testdb.Exec(t, db, `update pgflow.step_tasks set queued_at = now() - interval '2 hours', started_at = now() - interval '1 hour' where flow_slug = 'stall_flow'`)
	if n := scalar[int](t, db, `select pgflow.requeue_stalled_tasks()`); n != 1 {
		t.Fatalf("requeue_stalled_tasks requeued %d, want 1", n)
	}
	e.held = nil
	e.drain("stall_flow", func(claimed) taskOutcome { return taskOutcome{output: `"finally"`} })
}

// snapshot is everything compared between the two databases.
func snapshot(t *testing.T, db q) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	collect := func(key, sql string) {
		rows, err := db.Query(context.Background(), sql)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		out[key], err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	collect("runs", `select format('%s %s %s rem=%s out=%s done=%s failed=%s', run_id, flow_slug, status, remaining_steps, output,
		completed_at is not null, failed_at is not null) from pgflow.runs order by run_id`)
	collect("step_states", `select format('%s %s %s tasks=%s/%s deps=%s out=%s err=%s skip=%s started=%s done=%s failed=%s skipped=%s',
		run_id, step_slug, status, remaining_tasks, initial_tasks, remaining_deps, output, error_message, skip_reason,
		started_at is not null, completed_at is not null, failed_at is not null, skipped_at is not null)
		from pgflow.step_states order by run_id, step_slug`)
	collect("step_tasks", `select format('%s %s #%s %s msg=%s attempts=%s out=%s err=%s requeued=%s stalled=%s worker=%s started=%s',
		run_id, step_slug, task_index, status, message_id, attempts_count, output, error_message, requeued_count,
		permanently_stalled_at is not null, last_worker_id, started_at is not null)
		from pgflow.step_tasks order by run_id, step_slug, task_index`)
	// Where each task's message is: visible / hidden in the queue, archived, or gone.
	collect("messages", `select format('%s %s #%s %s', t.run_id, t.step_slug, t.task_index,
		pgflow_test.where_msg(lower(t.flow_slug), t.message_id))
		from pgflow.step_tasks t order by t.run_id, t.step_slug, t.task_index`)
	// Broadcasts in order, timestamps reduced to whether they are set.
	collect("events", `select format('%s %s %s %s', b.topic, b.event, b.private,
		(select jsonb_object_agg(k, case when k like '%\_at' and v <> 'null'::jsonb then '"<ts>"'::jsonb else v end)
		   from jsonb_each(b.payload) as p(k, v)))
		from realtime.recorded_broadcasts b order by b.id`)
	collect("queues", `select queue_name::text from pgmq.list_queues() order by 1`)
	return out
}

// whereMsg (in a test-only schema) says where a message is: visible or
// hidden in its queue, archived, or gone.
const whereMsg = `
create schema pgflow_test;
create function pgflow_test.where_msg(queue text, id bigint) returns text
language plpgsql as $$
declare
  r text;
begin
  if id is null then return 'no message'; end if;
  if to_regclass('pgmq.' || pgmq.format_table_name(queue, 'q')) is null then return 'no queue'; end if;
  execute format('select case when vt <= clock_timestamp() then ''visible'' else ''hidden'' end from pgmq.%I where msg_id = $1',
                 pgmq.format_table_name(queue, 'q')) into r using id;
  if r is not null then return r; end if;
  execute format('select ''archived'' from pgmq.%I where msg_id = $1', pgmq.format_table_name(queue, 'a')) into r using id;
  return coalesce(r, 'gone');
end
$$`

// The same operations on 0.16.0 and on a database upgraded in the middle
// of them: equal states, message places and realtime events.
func TestBehaviourMatches016AcrossTheUpgrade(t *testing.T) {
	run := func(upgraded bool) map[string][]string {
		db := testdb.Baseline(t)
		testdb.Exec(t, db.Pool, whereMsg)
		define(t, db.Pool)
		// In flight across the upgrade: the chain's first step done on 0.16.0.
		testdb.Exec(t, db.Pool, `select pgflow.start_flow('Chain_Flow', '{"n": 1}', $1::uuid)`, runID(1))
		// One round only: the map's tasks stay queued across the upgrade.
		old := &engine{t: t, db: db.Pool}
		for _, c := range old.claim("Chain_Flow") {
			old.finish(c, taskOutcome{output: `[1, 2, 3]`})
		}
		if upgraded {
			applyMigration(t, db.Pool)
		}
		e := &engine{t: t, db: db.Pool, v17: upgraded}
		e.scenario()
		snap := snapshot(t, db.Pool)
		testdb.Exec(t, db.Pool, `select pgflow.delete_flow_and_data('Chain_Flow')`)
		snap["after_delete"] = snapshot(t, db.Pool)["queues"]
		return snap
	}
	want := run(false)
	got := run(true)
	// The skips of one cascade come in another order on 0.17.0 (the run's
	// rows in physical order, not step order; TestCascadeSkipBroadcastOrder
	// asserts it): compared as sets here.
	want["events"], got["events"] = sortSkipRuns(want["events"]), sortSkipRuns(got["events"])
	for _, key := range []string{"runs", "step_states", "step_tasks", "messages", "events", "queues", "after_delete"} {
		if !reflect.DeepEqual(want[key], got[key]) {
			t.Errorf("%s differ after the upgrade:\n%s", key, lineDiff(want[key], got[key]))
		}
	}
	if len(want["events"]) < 40 || len(want["runs"]) != 8 {
		t.Fatalf("the scenario is too small to prove anything: %d events, %d runs", len(want["events"]), len(want["runs"]))
	}
	// And the end states themselves (runs, events, a cancelled held task), on the upgraded side.
	for _, must := range []string{
		runID(1) + " Chain_Flow completed",
		runID(2) + " retry_flow completed",
		runID(3) + " doomed failed",
		runID(5) + " cond_fail failed",
		runID(7) + " typeviol failed",
	} {
		if !hasPrefixLine(got["runs"], must) {
			t.Errorf("no run %q in %v", must, got["runs"])
		}
	}
	for _, must := range []string{
		`step:items:completed`, `step:total:completed`, `run:completed`,
		`"skip_reason": "condition_unmet"`, `"skip_reason": "dependency_skipped"`, `"skip_reason": "handler_failed"`,
		`"error_message": "Condition not met"`,
	} {
		if !containsLine(got["events"], must) {
			t.Errorf("no event with %s", must)
		}
	}
	if !containsLine(got["step_tasks"], runID(3)+" b #0 cancelled") || !containsLine(got["messages"], runID(3)+" b #0 archived") {
		t.Errorf("the held task of the failed run is not cancelled with its message archived:\n%s\n%s",
			strings.Join(got["step_tasks"], "\n"), strings.Join(got["messages"], "\n"))
	}
}

// lineDiff lists the lines only one side has, in order.
func lineDiff(want, got []string) string {
	var b strings.Builder
	n := max(len(want), len(got))
	for i := 0; i < n; i++ {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			fmt.Fprintf(&b, "  [%d] 0.16.0: %s\n  [%d] 0.17.0: %s\n", i, w, i, g)
		}
	}
	return b.String()
}

func hasPrefixLine(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}

func containsLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// sortSkipRuns sorts each run of consecutive step:<slug>:skipped events.
func sortSkipRuns(events []string) []string {
	out := append([]string(nil), events...)
	isSkip := func(e string) bool { return strings.Contains(e, ":skipped ") }
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && isSkip(out[j]) {
			j++
		}
		if j > i {
			sort.Strings(out[i:j])
			i = j
		} else {
			i++
		}
	}
	return out
}
