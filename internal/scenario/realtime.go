package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The realtime scenario runs the same operations on two databases of the
// 0.16.0 baseline: one stays 0.16.0, the other is upgraded between a prelude
// and the operations. pgflow 0.17.0 keeps every realtime call (same events,
// topics and payload keys), so the broadcasts the stub recorded
// (realtime.recorded_broadcasts) must match one for one, timestamps aside,
// and the runs, steps and tasks must end in the same states. Run ids are
// fixed, so topics compare exactly. Claims go through each version's own
// start_tasks, the way each version's worker calls it.

const rtWorker = "00000000-0000-4000-8000-00000000f0f0"

func rtRun(n int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", 0xf000+n) }

// rtDefinitions are the flows, defined with the 0.16.0 API.
var rtDefinitions = []string{
	`select pgflow.create_flow('rt_chain', max_attempts => 1)`,
	`select pgflow.add_step('rt_chain', 'first')`,
	`select pgflow.add_step('rt_chain', 'items', array['first'], step_type => 'map')`,
	`select pgflow.add_step('rt_chain', 'total', array['items'])`,
	`select pgflow.create_flow('rt_retry', max_attempts => 3, base_delay => 0)`,
	`select pgflow.add_step('rt_retry', 'flaky')`,
	`select pgflow.create_flow('rt_doomed', max_attempts => 2, base_delay => 0)`,
	`select pgflow.add_step('rt_doomed', 'a')`,
	`select pgflow.add_step('rt_doomed', 'b')`,
	`select pgflow.create_flow('rt_cond')`,
	`select pgflow.add_step('rt_cond', 'check')`,
	`select pgflow.add_step('rt_cond', 'needs_ok', array['check'], required_input_pattern => '{"check": {"ok": true}}')`,
	`select pgflow.add_step('rt_cond', 'after', array['needs_ok'])`,
	`select pgflow.add_step('rt_cond', 'cascade', array['check'], forbidden_input_pattern => '{"check": {"ok": false}}', when_unmet => 'skip-cascade')`,
	`select pgflow.add_step('rt_cond', 'below', array['cascade'])`,
	`select pgflow.create_flow('rt_gate')`,
	`select pgflow.add_step('rt_gate', 'gate', required_input_pattern => '{"go": true}', when_unmet => 'fail')`,
	`select pgflow.create_flow('rt_skip', max_attempts => 1)`,
	`select pgflow.add_step('rt_skip', 's1', when_exhausted => 'skip')`,
	`select pgflow.add_step('rt_skip', 's2', array['s1'])`,
	`select pgflow.add_step('rt_skip', 'c1', when_exhausted => 'skip-cascade')`,
	`select pgflow.add_step('rt_skip', 'c2', array['c1'])`,
	`select pgflow.create_flow('rt_empty')`,
	`select pgflow.add_step('rt_empty', 'items', step_type => 'map')`,
	`select pgflow.add_step('rt_empty', 'sum', array['items'])`,
}

// rtTask is one claimed task.
type rtTask struct {
	flow, run, step string
	index           int
	input           json.RawMessage
}

// rtOutcome: complete with output, fail with error, or hold (answer later).
type rtOutcome struct {
	output, fail string
	hold         bool
}

// rtDriver claims and answers tasks in one session, deterministically.
type rtDriver struct {
	db    *DB
	v17   bool
	tries map[string]int
	held  []rtTask
}

// claim reads the visible messages of flow's queue and claims them through
// the version's start_tasks, in message-id order.
func (d *rtDriver) claim(ctx context.Context, flow string) ([]rtTask, error) {
	var ids []int64
	if err := d.db.Pool.QueryRow(ctx, `select coalesce(array_agg(msg_id order by msg_id), '{}')
		from pgmq.read($1, 30, 100)`, strings.ToLower(flow)).Scan(&ids); err != nil {
		return nil, fmt.Errorf("reading %s's queue: %w", flow, err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	sql := `select run_id::text, step_slug, task_index, input, msg_id
	          from pgflow.start_tasks(flow_slug => $1, msg_ids => $2, worker_id => $3::uuid) order by msg_id`
	args := []any{flow, ids, rtWorker}
	if d.v17 {
		sql = `select run_id::text, step_slug, task_index, input, msg_id
		         from pgflow.start_tasks(flow_slug => $1, msg_ids => $2, worker_id => $3::uuid, queue_name => $4) order by msg_id`
		args = append(args, strings.ToLower(flow))
	}
	rows, err := d.db.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("start_tasks(%s): %w", flow, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (rtTask, error) {
		t := rtTask{flow: flow}
		var msg int64
		err := r.Scan(&t.run, &t.step, &t.index, &t.input, &msg)
		return t, err
	})
}

// answer completes or fails a task (or keeps it for later).
func (d *rtDriver) answer(ctx context.Context, t rtTask, o rtOutcome) error {
	var err error
	switch {
	case o.hold:
		d.held = append(d.held, t)
	case o.fail != "":
		_, err = d.db.Pool.Exec(ctx, `select count(*) from pgflow.fail_task($1::uuid, $2, $3, $4)`, t.run, t.step, t.index, o.fail)
	default:
		_, err = d.db.Pool.Exec(ctx, `select count(*) from pgflow.complete_task($1::uuid, $2, $3, $4::jsonb)`, t.run, t.step, t.index, o.output)
	}
	if err != nil {
		return fmt.Errorf("answering %s/%s[%d]: %w", t.run, t.step, t.index, err)
	}
	return nil
}

// drain claims and answers flow's tasks until none is visible.
func (d *rtDriver) drain(ctx context.Context, flow string, handle func(t rtTask, try int) rtOutcome) error {
	for range 20 {
		tasks, err := d.claim(ctx, flow)
		if err != nil || len(tasks) == 0 {
			return err
		}
		for _, t := range tasks {
			key := fmt.Sprintf("%s/%s/%d", t.run, t.step, t.index)
			d.tries[key]++
			if err := d.answer(ctx, t, handle(t, d.tries[key])); err != nil {
				return err
			}
		}
	}
	return errorf("%s: messages still visible after 20 rounds", flow)
}

func (d *rtDriver) exec(ctx context.Context, sql string, args ...any) error {
	if _, err := d.db.Pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", firstLine(strings.TrimSpace(sql)), err)
	}
	return nil
}

// rtPrelude defines the flows and leaves a run in mid-flight (its first task
// started), before any upgrade.
func rtPrelude(ctx context.Context, d *rtDriver) error {
	for _, s := range rtDefinitions {
		if err := d.exec(ctx, s); err != nil {
			return err
		}
	}
	if err := d.exec(ctx, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1::uuid, 'rt', 'replay')`, rtWorker); err != nil {
		return err
	}
	if err := d.exec(ctx, `select count(*) from pgflow.start_flow('rt_chain', '{}'::jsonb, $1::uuid)`, rtRun(1)); err != nil {
		return err
	}
	tasks, err := d.claim(ctx, "rt_chain")
	if err != nil {
		return err
	}
	if len(tasks) != 1 {
		return errorf("prelude claimed %d tasks of rt_chain, want 1", len(tasks))
	}
	d.held = tasks
	return nil
}

// rtOperations: a run crossing the upgrade, a map of many tasks, retries,
// a failing run with a late answer, conditions (skip, skip-cascade, fail),
// exhausted steps skipped and cascaded, and a taskless map.
func rtOperations(ctx context.Context, d *rtDriver) error {
	ok := func(out string) func(rtTask, int) rtOutcome {
		return func(rtTask, int) rtOutcome { return rtOutcome{output: out} }
	}
	// The chain's first task, started before the upgrade, completes after it.
	first := d.held[0]
	d.held = nil
	if err := d.answer(ctx, first, rtOutcome{output: `[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]`}); err != nil {
		return err
	}
	if err := d.drain(ctx, "rt_chain", func(t rtTask, _ int) rtOutcome {
		if t.step == "items" {
			return rtOutcome{output: string(t.input)}
		}
		return rtOutcome{output: `"sum"`}
	}); err != nil {
		return err
	}
	steps := []struct {
		flow, input string
		handle      func(rtTask, int) rtOutcome
	}{
		{"rt_retry", `{}`, func(_ rtTask, try int) rtOutcome {
			if try < 3 {
				return rtOutcome{fail: fmt.Sprintf("transient %d", try)}
			}
			return rtOutcome{output: `{"ok": 1}`}
		}},
		{"rt_doomed", `{}`, func(t rtTask, _ int) rtOutcome {
			if t.step == "b" {
				return rtOutcome{hold: true}
			}
			return rtOutcome{fail: "always"}
		}},
		{"rt_cond", `{}`, func(t rtTask, _ int) rtOutcome {
			if t.step == "check" {
				return rtOutcome{output: `{"ok": false}`}
			}
			return rtOutcome{output: `"ran"`}
		}},
		{"rt_gate", `{"go": false}`, ok(`"never"`)},
		{"rt_skip", `{}`, func(t rtTask, _ int) rtOutcome {
			if t.step == "s1" || t.step == "c1" {
				return rtOutcome{fail: "broken " + t.step}
			}
			return rtOutcome{output: `"ok"`}
		}},
		{"rt_empty", `[]`, ok(`"nothing"`)},
	}
	for i, s := range steps {
		if err := d.exec(ctx, `select count(*) from pgflow.start_flow($1, $2::jsonb, $3::uuid)`, s.flow, s.input, rtRun(i+2)); err != nil {
			return err
		}
		if err := d.drain(ctx, s.flow, s.handle); err != nil {
			return err
		}
	}
	// Late answers for tasks of the failed run (cancelled meanwhile).
	for _, t := range d.held {
		if err := d.answer(ctx, t, rtOutcome{output: `"late"`}); err != nil {
			return err
		}
	}
	d.held = nil
	return nil
}

// rtEvent is one broadcast with its timestamps blanked.
type rtEvent struct {
	Topic, Event string
	Private      bool
	Payload      string // canonical JSON, every *_at value replaced by "<at>"
}

func (e rtEvent) String() string {
	return fmt.Sprintf("%s %s private=%t %s", e.Topic, e.Event, e.Private, e.Payload)
}

// broadcasts returns the recorded broadcasts after id mark, in order.
func broadcasts(ctx context.Context, db *DB, mark int64) ([]rtEvent, int64, error) {
	rows, err := db.Pool.Query(ctx, `select id, topic, event, private, payload
		from realtime.recorded_broadcasts where id > $1 order by id`, mark)
	if err != nil {
		return nil, 0, fmt.Errorf("reading realtime.recorded_broadcasts: %w", err)
	}
	defer rows.Close()
	var out []rtEvent
	last := mark
	for rows.Next() {
		var e rtEvent
		var payload map[string]any
		if err := rows.Scan(&last, &e.Topic, &e.Event, &e.Private, &payload); err != nil {
			return nil, 0, err
		}
		for k := range payload {
			if strings.HasSuffix(k, "_at") && payload[k] != nil {
				payload[k] = "<at>"
			}
		}
		b, err := json.Marshal(payload) // map keys come out sorted
		if err != nil {
			return nil, 0, err
		}
		e.Payload = string(b)
		out = append(out, e)
	}
	return out, last, rows.Err()
}

// rtStates lists the end states of runs, steps and tasks, timestamps aside.
func rtStates(ctx context.Context, db *DB) ([]string, error) {
	rows, err := db.Pool.Query(ctx, `
		select format('run %s %s remaining %s output %s', run_id, status, remaining_steps, output) from pgflow.runs
		union all
		select format('step %s/%s %s skip %s remaining %s error %s', run_id, step_slug, status, skip_reason, remaining_tasks, error_message) from pgflow.step_states
		union all
		select format('task %s/%s[%s] %s attempts %s output %s error %s', run_id, step_slug, task_index, status, attempts_count, output, error_message) from pgflow.step_tasks
		order by 1`)
	if err != nil {
		return nil, fmt.Errorf("reading end states: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func realtimeEvents(ctx context.Context, env *Env) error {
	old, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	upg, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	d16 := &rtDriver{db: old, tries: map[string]int{}}
	d17 := &rtDriver{db: upg, tries: map[string]int{}}
	if err := rtPrelude(ctx, d16); err != nil {
		return fmt.Errorf("0.16.0 database: %w", err)
	}
	if err := rtPrelude(ctx, d17); err != nil {
		return fmt.Errorf("database to upgrade: %w", err)
	}
	pre16, mark16, err := broadcasts(ctx, old, 0)
	if err != nil {
		return err
	}
	_, mark17, err := broadcasts(ctx, upg, 0)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, upg); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	during, _, err := broadcasts(ctx, upg, mark17)
	if err != nil {
		return err
	}
	if len(during) > 0 {
		return errorf("the upgrade itself broadcast %d events, first: %s", len(during), during[0])
	}
	d17.v17 = true
	if err := rtOperations(ctx, d16); err != nil {
		return fmt.Errorf("operations on 0.16.0: %w", err)
	}
	if err := rtOperations(ctx, d17); err != nil {
		return fmt.Errorf("operations after the upgrade: %w", err)
	}
	ev16, _, err := broadcasts(ctx, old, mark16)
	if err != nil {
		return err
	}
	ev17, _, err := broadcasts(ctx, upg, mark17)
	if err != nil {
		return err
	}
	if err := sameEvents(ev16, ev17); err != nil {
		return err
	}
	checked, err := factsKeys(ev17)
	if err != nil {
		return err
	}
	s16, err := rtStates(ctx, old)
	if err != nil {
		return err
	}
	s17, err := rtStates(ctx, upg)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(s16, s17) {
		return fmt.Errorf("end states differ between 0.16.0 and the upgraded database:\n%s", firstDiff(s16, s17))
	}
	env.Notef("%d broadcasts after the prelude (%d before it) identical to 0.16.0's, %s (%d of them against the facts' payload keys); %d run/step/task end states identical",
		len(ev17), len(pre16), eventKinds(ev17), checked, len(s17))
	return nil
}

// sameEvents compares two broadcast streams one for one, except that the
// step:<slug>:skipped events of one cascade compare as a set: pgflow 0.17.0
// sends them in the order the executor visits the run's rows (not step
// order, as the 0.16.0 baseline does).
func sameEvents(want, got []rtEvent) error {
	want, got = sortSkipRuns(want), sortSkipRuns(got)
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			return errorf("broadcast %d differs after the upgrade:\n  0.16.0:   %s\n  upgraded: %s", i+1, want[i], got[i])
		}
	}
	if len(want) != len(got) {
		return errorf("0.16.0 broadcast %d events, the upgraded database %d", len(want), len(got))
	}
	if len(want) == 0 {
		return errorf("no broadcast recorded: the operations proved nothing")
	}
	return nil
}

// sortSkipRuns sorts each run of consecutive step:<slug>:skipped events of
// one topic.
func sortSkipRuns(evs []rtEvent) []rtEvent {
	out := slices.Clone(evs)
	skip := func(i, first int) bool {
		return strings.HasSuffix(out[i].Event, ":skipped") && out[i].Topic == out[first].Topic
	}
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && skip(j, i) {
			j++
		}
		if j == i {
			i++
			continue
		}
		slices.SortFunc(out[i:j], func(a, b rtEvent) int { return strings.Compare(a.String(), b.String()) })
		i = j
	}
	return out
}

// eventKinds summarises a stream: "12 step:started, 3 run:failed, ...".
func eventKinds(evs []rtEvent) string {
	n := map[string]int{}
	for _, e := range evs {
		kind := e.Event
		if parts := strings.Split(e.Event, ":"); len(parts) == 3 {
			kind = parts[0] + ":" + parts[2]
		}
		n[kind]++
	}
	keys := make([]string, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", n[k], k)
	}
	return strings.Join(parts, ", ")
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("  0.16.0:   %s\n  upgraded: %s", a[i], b[i])
		}
	}
	return fmt.Sprintf("  0.16.0 has %d rows, the upgraded database %d", len(a), len(b))
}

// 0.17.0's payload keys for the events its replaced functions send (as
// upstream's 0.17.0 functions build them); run:started, run:completed and
// step:completed come from functions 0.17.0 does not replace or carry the
// step's output, and are compared with 0.16.0 only.
var factsPayloadKeys = map[string]string{
	"step:started":         "event_type remaining_deps remaining_tasks run_id started_at status step_slug",
	"step:failed":          "error_message event_type failed_at run_id status step_slug",
	"run:failed":           "error_message event_type failed_at flow_slug run_id status",
	"step:skipped:handler": "error_message event_type run_id skip_reason skipped_at status step_slug",
	"step:skipped:cascade": "event_type flow_slug run_id skip_reason skipped_at status step_slug",
}

// factsKeys checks the upgraded stream against factsPayloadKeys: topic
// pgflow:run:<run_id>, private false, and each event's payload keys. It
// returns how many events it checked.
func factsKeys(evs []rtEvent) (int, error) {
	n := 0
	for _, e := range evs {
		var p map[string]any
		if err := json.Unmarshal([]byte(e.Payload), &p); err != nil {
			return n, err
		}
		if run, _ := p["run_id"].(string); e.Topic != "pgflow:run:"+run || e.Private {
			return n, errorf("broadcast %s: want topic pgflow:run:<run_id> and private=false", e)
		}
		kind := e.Event
		if parts := strings.Split(e.Event, ":"); len(parts) == 3 {
			kind = parts[0] + ":" + parts[2]
		}
		if kind == "step:skipped" {
			kind = "step:skipped:cascade"
			if p["skip_reason"] == "handler_failed" {
				kind = "step:skipped:handler"
			}
		}
		want, ok := factsPayloadKeys[kind]
		if !ok {
			continue
		}
		keys := make([]string, 0, len(p))
		for k := range p {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if got := strings.Join(keys, " "); got != want {
			return n, errorf("broadcast %s: payload keys %q, the facts say %q", e, got, want)
		}
		n++
	}
	return n, nil
}
