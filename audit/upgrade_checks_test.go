package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// only runs the given checks on db.
func only(t *testing.T, db *testdb.DB, opts audit.Options, ids ...string) *audit.Report {
	t.Helper()
	opts.Checks = ids
	return runAudit(t, db, opts)
}

func TestFlowCaseAlias(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('MyFlow')`)
	mustBeOK(t, only(t, db, audit.Options{}, "flows.case_alias"), "flows.case_alias")
	db.Exec(t, `select pgflow.create_flow('myflow')`, `select pgflow.create_flow('MYFLOW')`)
	f := mustFire(t, only(t, db, audit.Options{}, "flows.case_alias"), "flows.case_alias", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slugs", "MYFLOW, MyFlow, myflow") || !sampleHas(f, "queue_table", "pgmq.q_myflow") ||
		!strings.Contains(f.Message, "3 flows") || f.Remedy == "" || f.AtLeast {
		t.Fatalf("%+v", f)
	}
}

func TestStepCaseAlias(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.add_step('f', 'b')`, `select pgflow.create_flow('g')`, `select pgflow.add_step('g', 'B')`)
	// Same letters in two flows: fine.
	mustBeOK(t, only(t, db, audit.Options{}, "steps.case_alias"), "steps.case_alias")
	db.Exec(t, `select pgflow.add_step('f', 'B')`)
	f := mustFire(t, only(t, db, audit.Options{}, "steps.case_alias"), "steps.case_alias", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slug", "f") || !sampleHas(f, "step_slugs", "B, b") || !strings.Contains(f.Message, "2 steps") {
		t.Fatalf("%+v", f)
	}
}

func TestSlugRule(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('ok_2')`, `select pgflow.add_step('ok_2', 'x9')`)
	mustBeOK(t, only(t, db, audit.Options{}, "slugs.strict_rule"), "slugs.strict_rule")
	// Valid under 0.16.0, not under 0.17.0.
	db.Exec(t, `select pgflow.create_flow('_lead')`,
		`select pgflow.add_step('f', 'trail_')`,
		`select pgflow.add_step('f', 'a__b')`)
	f := mustFire(t, only(t, db, audit.Options{Sample: 10}, "slugs.strict_rule"), "slugs.strict_rule", audit.Blocker)
	if f.Count != 3 || !strings.Contains(f.Message, "1 flow slug(s), 2 step slug(s)") || len(f.Samples) != 3 {
		t.Fatalf("%+v", f)
	}
	want := map[string]string{"_lead": "first character is not a letter", "trail_": "last character is not a letter or digit", "a__b": "contains __"}
	for _, s := range f.Samples {
		slug := toText(s["step_slug"])
		if s["kind"] == "flow" {
			slug = toText(s["flow_slug"])
		}
		if w, ok := want[slug]; !ok || !strings.Contains(toText(s["reasons"]), w) {
			t.Errorf("sample %+v: want reason %q", s, w)
		}
	}
	// Samples are bounded; the count is not.
	f = mustFire(t, only(t, db, audit.Options{Sample: 1}, "slugs.strict_rule"), "slugs.strict_rule", audit.Blocker)
	if f.Count != 3 || len(f.Samples) != 1 {
		t.Fatalf("sample 1: %+v", f)
	}
}

func TestQueueNameTooLong(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, only(t, db, audit.Options{}, "flows.queue_name_too_long"), "flows.queue_name_too_long")
	// pgmq refuses such a queue, so 0.16.0's create_flow cannot make this
	// flow; rows written directly can.
	long := strings.Repeat("a", 47) + "B"
	db.Exec(t, `insert into pgflow.flows (flow_slug) values ('`+long+`'), ('`+strings.Repeat("c", 47)+`')`,
		`insert into pgflow.steps (flow_slug, step_slug) values ('`+long+`', 's')`)
	f := mustFire(t, only(t, db, audit.Options{}, "flows.queue_name_too_long"), "flows.queue_name_too_long", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slug", long) || !sampleHas(f, "length", "48") || !sampleHas(f, "has_steps", "true") {
		t.Fatalf("%+v", f)
	}
	// A long-slug flow without steps or tasks does not stop upstream's
	// migration (only steps and tasks get queue_name): a warning.
	stepless := strings.Repeat("d", 50)
	db.Exec(t, `insert into pgflow.flows (flow_slug) values ('`+stepless+`')`)
	r := result(t, only(t, db, audit.Options{}, "flows.queue_name_too_long"), "flows.queue_name_too_long")
	if r.Status != audit.StatusFindings || len(r.Findings) != 2 {
		t.Fatalf("%s %s %+v", r.Status, r.Error, r.Findings)
	}
	b, w := r.Findings[0], r.Findings[1]
	if b.Severity != audit.Blocker || b.Count != 1 || !sampleHas(b, "flow_slug", long) {
		t.Fatalf("blocker: %+v", b)
	}
	if w.Severity != audit.Warning || w.Count != 1 || !sampleHas(w, "flow_slug", stepless) || !sampleHas(w, "has_steps", "false") ||
		!strings.Contains(w.Remedy, "cannot get steps") {
		t.Fatalf("warning: %+v", w)
	}
	// Alone, the stepless flow is no blocker.
	db.Exec(t, `delete from pgflow.steps where flow_slug = '`+long+`'`, `delete from pgflow.flows where flow_slug = '`+long+`'`)
	rep := only(t, db, audit.Options{}, "flows.queue_name_too_long")
	if w := mustFire(t, rep, "flows.queue_name_too_long", audit.Warning); w.Count != 1 || rep.Blockers() != 0 {
		t.Fatalf("stepless only: blockers %d, %+v", rep.Blockers(), w)
	}
}

// mapFlow is a baseline with flow "m" (a root map step) and one started
// run of n tasks, each with its own message.
func mapFlow(t *testing.T, n int) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	db.Exec(t, `select pgflow.create_flow('m')`, `select pgflow.add_step('m', 'items', step_type => 'map')`,
		`select pgflow.start_flow('m', (select jsonb_agg(i) from generate_series(1, `+itoa(int64(n))+`) i))`)
	return db
}

func TestDuplicateMessageID(t *testing.T) {
	db := mapFlow(t, 40)
	for _, bound := range []int64{0, 3} {
		mustBeOK(t, only(t, db, audit.Options{Bound: bound}, "tasks.duplicate_message_id"), "tasks.duplicate_message_id")
	}
	// Three pairs spread over the id range, one of them three tasks deep;
	// a NULL message id is never a duplicate.
	db.Exec(t, `with ids as (select task_index, message_id from pgflow.step_tasks)
	             update pgflow.step_tasks t set message_id = case
	               when t.task_index in (1, 2, 3) then (select message_id from ids where task_index = 0)
	               when t.task_index = 20 then (select message_id from ids where task_index = 21)
	               when t.task_index = 38 then (select message_id from ids where task_index = 39)
	               when t.task_index in (10, 11) then null
	               else t.message_id end`,
		`analyze pgflow.step_tasks`)
	// Exact whatever the chunk size: one range, or ranges of ~3 rows.
	for _, bound := range []int64{0, 3, 1} {
		f := mustFire(t, only(t, db, audit.Options{Bound: bound, Sample: 2}, "tasks.duplicate_message_id"), "tasks.duplicate_message_id", audit.Blocker)
		if f.Count != 3 || !strings.Contains(f.Message, "(8 tasks)") || len(f.Samples) != 2 || f.AtLeast {
			t.Fatalf("bound %d: %+v", bound, f)
		}
		if !sampleHas(f, "tasks", "4") || !sampleHas(f, "queue", "m") {
			t.Fatalf("bound %d samples: %+v", bound, f.Samples)
		}
		if _, ok := f.Samples[0]["message_id"].(string); !ok {
			t.Fatalf("message_id is %T, want a string (exact in JSON)", f.Samples[0]["message_id"])
		}
	}
}

// Flows that differ only in case share one queue after the upgrade
// (lower(flow_slug)); their tasks' pairs are compared across them.
func TestDuplicateMessageIDAcrossCaseAliases(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('F')`, `select pgflow.add_step('F', 'a')`,
		`select pgflow.start_flow('F', '{}'::jsonb, '00000000-0000-4000-8000-000000000003')`)
	mustBeOK(t, only(t, db, audit.Options{}, "tasks.duplicate_message_id"), "tasks.duplicate_message_id")
	db.Exec(t, `update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks where flow_slug = 'f')
	             where flow_slug = 'F'`)
	f := mustFire(t, only(t, db, audit.Options{}, "tasks.duplicate_message_id"), "tasks.duplicate_message_id", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slugs", "F, f") || !sampleHas(f, "queue", "f") {
		t.Fatalf("%+v", f)
	}
}

// manyTasks adds n finished tasks (message ids 1000001..1000000+n) to flow "m".
func manyTasks(t *testing.T, db *testdb.DB, n int) {
	t.Helper()
	db.Exec(t,
		`insert into pgflow.runs (run_id, flow_slug, status, input, remaining_steps, started_at, completed_at)
		 values ('00000000-0000-4000-8000-0000000000aa', 'm', 'completed', '[]', 0, now() - interval '1 day', now())`,
		`insert into pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks, remaining_deps, created_at, started_at, completed_at)
		 values ('m', '00000000-0000-4000-8000-0000000000aa', 'items', 'completed', 0, `+itoa(int64(n))+`, 0, now() - interval '2 days', now() - interval '1 day', now())`,
		`insert into pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, task_index, status, attempts_count, queued_at, started_at, completed_at)
		 select 'm', '00000000-0000-4000-8000-0000000000aa', 'items', 1000000 + i, i, 'completed', 1, now() - interval '1 day', now() - interval '1 day', now()
		 from generate_series(1, `+itoa(int64(n))+`) i`,
		`analyze pgflow.step_tasks`)
}

// A check that runs out of its budget part-way says how far it got and is
// inconclusive (exit 4), never ok. The budget "runs out" after two ranges
// through a test hook, so the result does not depend on the machine's speed.
func TestDuplicateMessageIDOutOfBudget(t *testing.T) {
	db := mapFlow(t, 1)
	manyTasks(t, db, 30_000)
	restore := audit.StopDuplicateCheckAfter(2)
	rep := only(t, db, audit.Options{Bound: 5_000, CheckTimeout: time.Minute}, "tasks.duplicate_message_id")
	restore()
	r := result(t, rep, "tasks.duplicate_message_id")
	if r.Status != audit.StatusInconclusive || r.Coverage == nil || len(r.Findings) != 0 {
		t.Fatalf("status %s, coverage %+v, findings %+v: %s", r.Status, r.Coverage, r.Findings, r.Error)
	}
	c := r.Coverage
	// Two ranges of about Bound rows each: some rows examined, far from all.
	if c.Table != "pgflow.step_tasks" || c.Estimated < 25_000 || c.Examined < 1 || c.Examined > 20_000 || c.Examined >= c.Estimated {
		t.Fatalf("coverage %+v", c)
	}
	if !strings.Contains(r.Error, "inconclusive: examined "+itoa(c.Examined)+" of about "+itoa(c.Estimated)+" rows of pgflow.step_tasks") {
		t.Fatalf("error %q", r.Error)
	}
	// Exit 4 semantics: inconclusive, no blocker.
	if rep.Inconclusive() != 1 || rep.Blockers() != 0 {
		t.Fatalf("inconclusive %d, blockers %d", rep.Inconclusive(), rep.Blockers())
	}
	// With its budget, the same check answers exactly.
	mustBeOK(t, only(t, db, audit.Options{Bound: 100_000, CheckTimeout: time.Minute}, "tasks.duplicate_message_id"), "tasks.duplicate_message_id")
}

func TestUnownedQueue(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('MixedCase')`)
	mustBeOK(t, only(t, db, audit.Options{}, "pgmq.unowned_queue"), "pgmq.unowned_queue")
	db.Exec(t, `select pgmq.create('leftover')`, `select pgmq.create('_app_private')`)
	r := result(t, only(t, db, audit.Options{}, "pgmq.unowned_queue"), "pgmq.unowned_queue")
	if r.Status != audit.StatusFindings || len(r.Findings) != 2 {
		t.Fatalf("%s %s %+v", r.Status, r.Error, r.Findings)
	}
	w, i := r.Findings[0], r.Findings[1]
	if w.Severity != audit.Warning || w.Count != 1 || !sampleHas(w, "queue", "leftover") {
		t.Fatalf("warning: %+v", w)
	}
	if i.Severity != audit.Info || i.Count != 1 || !sampleHas(i, "queue", "_app_private") {
		t.Fatalf("info: %+v", i)
	}
}

func TestQueueCaseSpellings(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, only(t, db, audit.Options{}, "pgmq.queue_case_spellings"), "pgmq.queue_case_spellings")
	db.Exec(t, `select pgflow.create_flow('Orders')`, `select pgmq.create('orders')`)
	f := mustFire(t, only(t, db, audit.Options{}, "pgmq.queue_case_spellings"), "pgmq.queue_case_spellings", audit.Warning)
	if f.Count != 1 || !sampleHas(f, "spellings", "Orders, orders") || !sampleHas(f, "flow_slugs", "Orders") || !sampleHas(f, "queue_table", "pgmq.q_orders") {
		t.Fatalf("%+v", f)
	}
	// Owned through its other spelling: not unowned.
	mustBeOK(t, only(t, db, audit.Options{}, "pgmq.unowned_queue"), "pgmq.unowned_queue")
}

func TestFlowQueueMissing(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('g')`, `select pgflow.create_flow('Cased')`)
	mustBeOK(t, only(t, db, audit.Options{}, "pgmq.flow_queue_missing"), "pgmq.flow_queue_missing")
	db.Exec(t, `select pgmq.drop_queue('g')`)
	f := mustFire(t, only(t, db, audit.Options{}, "pgmq.flow_queue_missing"), "pgmq.flow_queue_missing", audit.Warning)
	if f.Count != 1 || !sampleHas(f, "flow_slug", "g") {
		t.Fatalf("%+v", f)
	}
}

func TestEveryRefusalConditionAtOnce(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('Dup')`, `select pgflow.create_flow('dup')`,
		`select pgflow.add_step('f', 'x')`, `select pgflow.add_step('f', 'X')`,
		`select pgflow.create_flow('bad__slug')`,
		`insert into pgflow.flows (flow_slug) values ('`+strings.Repeat("q", 48)+`')`,
		`insert into pgflow.steps (flow_slug, step_slug) values ('`+strings.Repeat("q", 48)+`', 's')`,
		`update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks)`)
	rep := runAudit(t, db, audit.Options{})
	for _, id := range []string{"flows.case_alias", "steps.case_alias", "slugs.strict_rule", "flows.queue_name_too_long", "tasks.duplicate_message_id"} {
		f := mustFire(t, rep, id, audit.Blocker)
		if f.Count < 1 || f.Remedy == "" || len(f.Samples) == 0 {
			t.Errorf("%s: %+v", id, f)
		}
	}
	if rep.Blockers() != 5 || rep.Errors() != 0 || rep.Inconclusive() != 0 {
		t.Fatalf("blockers %d, errors %d, inconclusive %d", rep.Blockers(), rep.Errors(), rep.Inconclusive())
	}
	// The preflight, in a transaction under apply's kind of locks, finds the same.
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `lock table pgflow.flows, pgflow.steps, pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	results, err := audit.RunPreflight(ctx, tx, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if audit.Blockers(results) != 5 {
		t.Fatalf("preflight blockers %d, want 5: %+v", audit.Blockers(results), results)
	}
}
