package migrations_test

// SQL-level tests of 20261202120000_pgflow_persist_queue.sql on a fresh
// 0.16.0 baseline (testdb.Baseline) each: the file is applied as one
// multi-statement Exec inside a transaction, the way psql -1 or atlas would.
// Message visibility is read from the documented pgmq q_ layout and compared
// with clock_timestamp(); lease expiry is simulated with pgmq.set_vt(.., 0),
// never by sleeping.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

const migrationFile = "20261202120000_pgflow_persist_queue.sql"

type q interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func migrationSQL(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(migrationFile)
	if err != nil {
		t.Fatalf("reading %s: %v", migrationFile, err)
	}
	return string(b)
}

// applyMigration runs the file in one transaction and commits it.
func applyMigration(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if err := tryMigration(pool); err != nil {
		t.Fatalf("applying %s: %v", migrationFile, err)
	}
}

func tryMigration(pool *pgxpool.Pool) error {
	ctx := context.Background()
	b, err := os.ReadFile(migrationFile)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, string(b))
		return err
	})
}

func exec(t *testing.T, db q, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func scalar[T any](t *testing.T, db q, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return v
}

func pgCode(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

func worker(t *testing.T, db q, queue string) string {
	t.Helper()
	return scalar[string](t, db, `insert into pgflow.workers (worker_id, queue_name, function_name)
		values (gen_random_uuid(), $1, 'test-fn') returning worker_id::text`, queue)
}

func startFlow(t *testing.T, db q, flow, input string) string {
	t.Helper()
	return scalar[string](t, db, `select run_id::text from pgflow.start_flow($1, $2::jsonb)`, flow, input)
}

// claim is one pgflow.claim_result row.
type claim struct {
	Kind, Queue      string
	MsgID            int64
	Flow, Run, Step  *string
	Index, Attempt   *int
	Input, FlowInput *string
	Reason           *string
}

func claimTasks(t *testing.T, db q, queue, workerID string, batch int) []claim {
	t.Helper()
	out, err := tryClaim(db, queue, workerID, batch)
	if err != nil {
		t.Fatalf("claim_tasks(%s): %v", queue, err)
	}
	return out
}

func tryClaim(db q, queue, workerID string, batch int) ([]claim, error) {
	rows, err := db.Query(context.Background(), `
		select kind, queue_name, message_id, flow_slug, run_id::text, step_slug, task_index, attempt,
		       input::text, flow_input::text, reason
		from pgflow.claim_tasks($1, $2::uuid, $3, 30)`, queue, workerID, batch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []claim
	for rows.Next() {
		var c claim
		if err := rows.Scan(&c.Kind, &c.Queue, &c.MsgID, &c.Flow, &c.Run, &c.Step, &c.Index, &c.Attempt,
			&c.Input, &c.FlowInput, &c.Reason); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

func tryClaimPoll(db q, queue, workerID string) ([]claim, error) {
	rows, err := db.Query(context.Background(), `
		select kind, queue_name, message_id, flow_slug, run_id::text, step_slug, task_index, attempt,
		       input::text, flow_input::text, reason
		from pgflow.claim_tasks($1, $2::uuid, 10, 30, max_poll_seconds => 5, poll_interval_ms => 50)`, queue, workerID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[claim])
}

func qtable(prefix, queue string) string {
	return "pgmq." + pgx.Identifier{prefix + "_" + strings.ToLower(queue)}.Sanitize()
}

// visible reports whether a message is in the queue and visible now.
func visible(t *testing.T, db q, queue string, msgID int64) bool {
	t.Helper()
	return scalar[bool](t, db, fmt.Sprintf(`select coalesce((select vt <= clock_timestamp() from %s where msg_id = $1), false)`,
		qtable("q", queue)), msgID)
}

func archived(t *testing.T, db q, queue string, msgID int64) bool {
	t.Helper()
	return scalar[bool](t, db, fmt.Sprintf(`select exists (select 1 from %s where msg_id = $1)
		and not exists (select 1 from %s where msg_id = $1)`, qtable("a", queue), qtable("q", queue)), msgID)
}

// fingerprint digests the pgflow catalog (columns, constraints, indexes,
// functions) and data, to prove a refused run changed nothing.
func fingerprint(t *testing.T, db q) string {
	t.Helper()
	return scalar[string](t, db, `select md5(concat_ws('|',
		(select string_agg(format('%s.%s:%s:%s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull), ',' order by c.relname, a.attnum)
		   from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
		  where n.nspname = 'pgflow' and a.attnum > 0 and not a.attisdropped),
		(select string_agg(pg_get_indexdef(i.indexrelid), ',' order by 1)
		   from pg_index i join pg_class c on c.oid = i.indrelid join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'pgflow'),
		(select string_agg(p.oid::regprocedure::text || md5(p.prosrc), ',' order by 1)
		   from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'pgflow'),
		(select string_agg(f::text, ',' order by f::text) from pgflow.flows f),
		(select string_agg(st::text, ',' order by st::text) from pgflow.step_tasks st),
		(select string_agg(m::text, ',' order by m::text) from pgmq.meta m)))`)
}

// legacyFlows builds 0.16.0 state: a single-step flow and a map flow with
// runs in flight, one task started by a 0.16.0 worker (read + start_tasks).
func legacyFlows(t *testing.T, db q) (startedMsg int64) {
	t.Helper()
	exec(t, db, `select pgflow.create_flow('legacy_single')`)
	exec(t, db, `select pgflow.add_step('legacy_single', 'only')`)
	exec(t, db, `select pgflow.create_flow('LegacyMap')`)
	exec(t, db, `select pgflow.add_step('LegacyMap', 'items', step_type => 'map')`)
	startFlow(t, db, "legacy_single", `{"n": 1}`)
	startFlow(t, db, "legacy_single", `{"n": 2}`)
	startFlow(t, db, "LegacyMap", `[1, 2, 3]`)
	w := worker(t, db, "legacy_single")
	startedMsg = scalar[int64](t, db, `select msg_id from pgmq.read('legacy_single', 5, 1)`)
	exec(t, db, `select count(*) from pgflow.start_tasks('legacy_single', array[$1::bigint], $2::uuid)`, startedMsg, w)
	return startedMsg
}

func TestMigrationBackfillsAndConstrains(t *testing.T) {
	db := testdb.Model(t)
	legacyFlows(t, db.Pool)
	tasksBefore := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks`)
	if tasksBefore != 5 {
		t.Fatalf("legacy state has %d tasks, want 5", tasksBefore)
	}
	applyMigration(t, db.Pool)

	for _, col := range []string{"flows", "step_tasks"} {
		nullable := scalar[string](t, db.Pool, `select is_nullable from information_schema.columns
			where table_schema = 'pgflow' and table_name = $1 and column_name = 'queue_name'`, col)
		if nullable != "NO" {
			t.Errorf("%s.queue_name is_nullable = %s, want NO", col, nullable)
		}
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.flows where queue_name is distinct from flow_slug`); n != 0 {
		t.Errorf("%d flows with queue_name <> flow_slug", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where queue_name is distinct from flow_slug`); n != 0 {
		t.Errorf("%d tasks with queue_name <> flow_slug", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks`); n != tasksBefore {
		t.Errorf("tasks after = %d, want %d", n, tasksBefore)
	}
	if v := scalar[int](t, db.Pool, `select pgflow.queue_protocol_version()`); v != 2 {
		t.Errorf("queue_protocol_version() = %d, want 2", v)
	}
	if n := scalar[string](t, db.Pool, `select name from pgflow.schema_revisions where version = '20261202120000'`); n != "pgflow_persist_queue" {
		t.Errorf("schema_revisions name = %q", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pg_trigger where tgrelid = 'pgflow.step_tasks'::regclass and not tgisinternal`); n != 0 {
		t.Errorf("step_tasks has %d triggers, want none", n)
	}

	// unique (queue_name, message_id): a second task pointing at a taken address.
	_, err := db.Pool.Exec(context.Background(), `update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks where flow_slug = 'LegacyMap')
		where flow_slug = 'LegacyMap' and task_index = 2`)
	if pgCode(err) != "23505" {
		t.Errorf("duplicate (queue_name, message_id): err = %v, want 23505", err)
	}
	// Case-only alias of an existing flow.
	_, err = db.Pool.Exec(context.Background(), `select pgflow.create_flow('legacymap')`)
	if pgCode(err) != "23505" {
		t.Errorf("create_flow of a case-only alias: err = %v, want 23505", err)
	}
	_, err = db.Pool.Exec(context.Background(), `insert into pgflow.flows (flow_slug, queue_name) values ('LEGACYMAP', 'LEGACYMAP')`)
	if pgCode(err) != "23505" {
		t.Errorf("insert of a case-only alias: err = %v, want 23505", err)
	}
}

func TestMigrationFencesOldProtocol(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	ctx := context.Background()

	_, err := db.Pool.Exec(ctx, `select pgflow.ensure_flow_compiled('f', '{"steps": []}'::jsonb)`)
	if pgCode(err) != "42883" {
		t.Errorf("two-argument ensure_flow_compiled: err = %v, want 42883", err)
	}
	_, err = db.Pool.Exec(ctx, `select * from pgflow.start_tasks('f', array[1]::bigint[], gen_random_uuid())`)
	if pgCode(err) != "42883" {
		t.Errorf("start_tasks: err = %v, want 42883", err)
	}

	shape := `{"steps": [{"slug": "a"}, {"slug": "b", "dependencies": ["a"]}]}`
	for _, want := range []string{"compiled", "verified"} {
		got := scalar[string](t, db.Pool, `select pgflow.ensure_flow_compiled('f', $1::jsonb, false) ->> 'status'`, shape)
		if got != want {
			t.Errorf("ensure_flow_compiled status = %s, want %s", got, want)
		}
	}
	if got := scalar[string](t, db.Pool, `select queue_name from pgflow.flows where flow_slug = 'f'`); got != "f" {
		t.Errorf("compiled flow queue_name = %q", got)
	}
	other := `{"steps": [{"slug": "a"}]}`
	if got := scalar[string](t, db.Pool, `select pgflow.ensure_flow_compiled('f', $1::jsonb, false) ->> 'status'`, other); got != "mismatch" {
		t.Errorf("changed shape without allow_data_loss: %s, want mismatch", got)
	}
	startFlow(t, db.Pool, "f", `{}`)
	if got := scalar[string](t, db.Pool, `select pgflow.ensure_flow_compiled('f', $1::jsonb, true) ->> 'status'`, other); got != "recompiled" {
		t.Errorf("changed shape with allow_data_loss: %s, want recompiled", got)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.runs`); n != 0 {
		t.Errorf("runs after recompile = %d, want 0", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgmq.list_queues() where queue_name = 'f'`); n != 1 {
		t.Errorf("queue f listed %d times after recompile, want 1", n)
	}
}

func TestMigrationRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, db *testdb.DB)
		want  string
	}{
		{"already upgraded", func(t *testing.T, db *testdb.DB) { applyMigration(t, db.Pool) }, "already applied"},
		{"case-only aliases", func(t *testing.T, db *testdb.DB) {
			exec(t, db.Pool, `select pgflow.create_flow('Orders')`)
			exec(t, db.Pool, `select pgflow.create_flow('orders')`)
		}, "differ only in case"},
		{"flow without queue", func(t *testing.T, db *testdb.DB) {
			exec(t, db.Pool, `select pgflow.create_flow('lonely')`)
			exec(t, db.Pool, `select pgmq.drop_queue('lonely')`)
		}, "without a pgmq queue"},
		{"duplicate message id", func(t *testing.T, db *testdb.DB) {
			legacyFlows(t, db.Pool)
			exec(t, db.Pool, `update pgflow.step_tasks set message_id = 1 where flow_slug = 'LegacyMap'`)
		}, "sharing a message id"},
		{"not pgflow 0.16.0", func(t *testing.T, db *testdb.DB) {
			exec(t, db.Pool, `drop function pgflow.start_tasks(text, bigint[], uuid)`)
		}, "0.16.0 functions"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			db := testdb.Model(t)
			tc.setup(t, db)
			before := fingerprint(t, db.Pool)
			err := tryMigration(db.Pool)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("migration error = %v, want it to mention %q", err, tc.want)
			}
			var pg *pgconn.PgError
			if !errors.As(err, &pg) || pg.Hint == "" {
				t.Errorf("refusal carries no hint: %v", err)
			}
			if after := fingerprint(t, db.Pool); after != before {
				t.Errorf("refused migration changed the database")
			}
		})
	}
}

// A started run's queued tasks are claimed once; a live lease is left alone;
// an expired lease is claimed again; inputs are what the handler needs.
func TestClaimTasksClaimsAndLeases(t *testing.T) {
	db := testdb.Model(t)
	startedMsg := legacyFlows(t, db.Pool)
	applyMigration(t, db.Pool)
	w := worker(t, db.Pool, "LegacyMap")

	got := claimTasks(t, db.Pool, "LegacyMap", w, 10)
	if len(got) != 3 {
		t.Fatalf("claimed %d tasks of LegacyMap, want 3: %+v", len(got), got)
	}
	for i, c := range got {
		if c.Kind != "claimed" || *c.Index != i || *c.Attempt != 1 || *c.Input != fmt.Sprint(i+1) || *c.FlowInput != "[1, 2, 3]" {
			t.Errorf("claim %d = kind %s index %d attempt %d input %s flow_input %s", i, c.Kind, *c.Index, *c.Attempt, *c.Input, *c.FlowInput)
		}
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where flow_slug = 'LegacyMap'
		and status = 'started' and attempts_count = 1 and last_worker_id = $1::uuid and started_at is not null`, w); n != 3 {
		t.Errorf("%d LegacyMap tasks started by the worker, want 3", n)
	}
	if again := claimTasks(t, db.Pool, "LegacyMap", w, 10); len(again) != 0 {
		t.Errorf("live leases were claimed again: %+v", again)
	}

	// The legacy single flow: one task started by the old worker (live lease
	// of timeout+2 s), one queued.
	got = claimTasks(t, db.Pool, "legacy_single", w, 10)
	if len(got) != 1 || got[0].MsgID == startedMsg || *got[0].Input != `{"n": 2}` {
		t.Fatalf("legacy_single claims = %+v, want only the queued task with the flow input", got)
	}
	// Its lease expires: the message is visible again and claimed again.
	exec(t, db.Pool, `select count(*) from pgmq.set_vt('legacy_single', $1, 0)`, startedMsg)
	got = claimTasks(t, db.Pool, "legacy_single", w, 10)
	if len(got) != 1 || got[0].MsgID != startedMsg || *got[0].Attempt != 2 {
		t.Fatalf("expired lease claims = %+v, want message %d at attempt 2", got, startedMsg)
	}
}

// Messages of terminal tasks are archived and nothing is returned for them.
func TestClaimTasksArchivesTerminal(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	exec(t, db.Pool, `select pgflow.ensure_flow_compiled('m', '{"steps": [{"slug": "items", "stepType": "map"}]}'::jsonb, false)`)
	run := startFlow(t, db.Pool, "m", `[1, 2, 3]`)
	w := worker(t, db.Pool, "m")
	// A task that finished while its message survived (say, a crash between
	// the two), and one of a permanently stalled task.
	done := scalar[int64](t, db.Pool, `update pgflow.step_tasks set status = 'completed', completed_at = now(), output = '1'
		where run_id = $1::uuid and task_index = 0 returning message_id`, run)
	stalled := scalar[int64](t, db.Pool, `update pgflow.step_tasks set status = 'started', started_at = now(), permanently_stalled_at = now()
		where run_id = $1::uuid and task_index = 1 returning message_id`, run)

	got := claimTasks(t, db.Pool, "m", w, 10)
	if len(got) != 1 || *got[0].Index != 2 {
		t.Fatalf("claims = %+v, want only task 2", got)
	}
	for _, id := range []int64{done, stalled} {
		if !archived(t, db.Pool, "m", id) {
			t.Errorf("message %d of a terminal task was not archived", id)
		}
	}
}

// Any fatal message: only fatal rows, nothing claimed, valid messages
// released, fatal ones left invisible.
func TestClaimTasksFatal(t *testing.T) {
	type setup func(t *testing.T, db q, run string) int64 // returns the fatal message id
	// point moves task 0 of the run onto a crafted message (its own is deleted).
	point := func(t *testing.T, db q, run string, body string) int64 {
		exec(t, db, `select pgmq.delete('m', message_id) from pgflow.step_tasks where run_id = $1::uuid and task_index = 0`, run)
		id := scalar[int64](t, db, `select pgmq.send('m', $1::jsonb)`, body)
		exec(t, db, `update pgflow.step_tasks set message_id = $1 where run_id = $2::uuid and task_index = 0`, id, run)
		return id
	}
	cases := []struct {
		reason string
		setup  setup
	}{
		{"no_task", func(t *testing.T, db q, run string) int64 {
			return scalar[int64](t, db, `select pgmq.send('m', jsonb_build_object('flow_slug', 'm', 'run_id', $1::text, 'step_slug', 'items', 'task_index', 7))`, run)
		}},
		{"wrong_route", func(t *testing.T, db q, run string) int64 {
			return point(t, db, run, fmt.Sprintf(`{"flow_slug": "other", "run_id": %q, "step_slug": "items", "task_index": 0}`, run))
		}},
		{"wrong_work", func(t *testing.T, db q, run string) int64 {
			return point(t, db, run, fmt.Sprintf(`{"flow_slug": "m", "run_id": %q, "step_slug": "items", "task_index": 1}`, run))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			db := testdb.Model(t)
			applyMigration(t, db.Pool)
			exec(t, db.Pool, `select pgflow.ensure_flow_compiled('m', '{"steps": [{"slug": "items", "stepType": "map"}]}'::jsonb, false)`)
			run := startFlow(t, db.Pool, "m", `[1, 2]`)
			w := worker(t, db.Pool, "m")
			fatal := tc.setup(t, db.Pool, run)

			got := claimTasks(t, db.Pool, "m", w, 10)
			if len(got) != 1 || got[0].Kind != "fatal" || got[0].MsgID != fatal || got[0].Reason == nil || *got[0].Reason != tc.reason {
				t.Fatalf("claims = %+v, want one fatal %s for message %d", got, tc.reason, fatal)
			}
			if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where status <> 'queued' or attempts_count <> 0`); n != 0 {
				t.Errorf("%d tasks changed by a fatal batch", n)
			}
			rows, _ := db.Pool.Query(context.Background(), `select message_id from pgflow.step_tasks where message_id <> $1`, fatal)
			valid, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(valid) == 0 {
				t.Fatalf("valid messages: %v %v", valid, err)
			}
			for _, id := range valid {
				if !visible(t, db.Pool, "m", id) {
					t.Errorf("valid message %d was not released", id)
				}
			}
			if visible(t, db.Pool, "m", fatal) {
				t.Errorf("fatal message %d is visible again", fatal)
			}
		})
	}
}

// Two claimers in open transactions at once get disjoint tasks, and many
// concurrent claimers drain a map step with every task claimed exactly once.
func TestClaimTasksConcurrentClaimers(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	ctx := context.Background()
	exec(t, db.Pool, `select pgflow.ensure_flow_compiled('m', '{"steps": [{"slug": "items", "stepType": "map"}]}'::jsonb, false)`)
	startFlow(t, db.Pool, "m", `[`+strings.TrimSuffix(strings.Repeat("0,", 60), ",")+`]`)
	w := worker(t, db.Pool, "m")

	tx1, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	tx2, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	a := claimTasks(t, tx1, "m", w, 5)
	b := claimTasks(t, tx2, "m", w, 5) // while tx1 still holds its claims
	if len(a) != 5 || len(b) != 5 {
		t.Fatalf("overlapping claimers got %d and %d tasks, want 5 and 5", len(a), len(b))
	}
	seen := map[int]bool{}
	for _, c := range append(a, b...) {
		if seen[*c.Index] {
			t.Errorf("task %d claimed twice", *c.Index)
		}
		seen[*c.Index] = true
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				got, err := tryClaim(db.Pool, "m", w, 3)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for _, c := range got {
					if c.Kind != "claimed" || seen[*c.Index] {
						errs <- fmt.Errorf("bad or duplicate claim %+v", c)
					}
					seen[*c.Index] = true
				}
				n := len(seen)
				mu.Unlock()
				if n == 60 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(seen) != 60 {
		t.Errorf("claimed %d distinct tasks, want 60", len(seen))
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where status = 'started' and attempts_count = 1`); n != 60 {
		t.Errorf("%d tasks started once, want 60", n)
	}
}

// complete_task, fail_task, release_task, requeue_stalled_tasks,
// delete_flow_and_data and prune act on the task's own queue_name, shown with
// a flow whose queue_name is not its slug.
func TestQueueAwareFunctions(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	ctx := context.Background()
	exec(t, db.Pool, `select pgflow.create_flow('f', max_attempts => 2, base_delay => 100)`)
	exec(t, db.Pool, `select pgflow.add_step('f', 'a')`)
	exec(t, db.Pool, `select pgflow.add_step('f', 'b', array['a'])`)
	exec(t, db.Pool, `select pgmq.create('elsewhere')`)
	exec(t, db.Pool, `update pgflow.flows set queue_name = 'elsewhere' where flow_slug = 'f'`)
	run := startFlow(t, db.Pool, "f", `{"x": 1}`)
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where queue_name = 'elsewhere'`); n != 1 {
		t.Fatalf("start_ready_steps: %d tasks in queue elsewhere, want 1", n)
	}
	w := worker(t, db.Pool, "elsewhere")
	if got := claimTasks(t, db.Pool, "f", w, 10); len(got) != 0 {
		t.Fatalf("claims from queue f = %+v, want none", got)
	}

	// fail_task with attempts left: queued again, message delayed in its queue.
	c := claimTasks(t, db.Pool, "elsewhere", w, 10)
	if len(c) != 1 {
		t.Fatalf("claims = %+v", c)
	}
	exec(t, db.Pool, `select count(*) from pgflow.fail_task($1::uuid, 'a', 0, 'boom')`, run)
	if visible(t, db.Pool, "elsewhere", c[0].MsgID) || !scalar[bool](t, db.Pool,
		`select vt > clock_timestamp() + interval '50 seconds' from pgmq.q_elsewhere where msg_id = $1`, c[0].MsgID) {
		t.Errorf("retry delay was not set on the message in queue elsewhere")
	}

	// release_task: queued again, attempt given back, message visible now.
	exec(t, db.Pool, `select count(*) from pgmq.set_vt('elsewhere', $1, 0)`, c[0].MsgID)
	c = claimTasks(t, db.Pool, "elsewhere", w, 10)
	if len(c) != 1 || *c[0].Attempt != 2 {
		t.Fatalf("retry claim = %+v, want attempt 2", c)
	}
	if scalar[bool](t, db.Pool, `select pgflow.release_task($1::uuid, 'a', 0, gen_random_uuid())`, run) {
		t.Errorf("release_task by another worker succeeded")
	}
	if !scalar[bool](t, db.Pool, `select pgflow.release_task($1::uuid, 'a', 0, $2::uuid)`, run, w) {
		t.Fatalf("release_task by the holder failed")
	}
	if !visible(t, db.Pool, "elsewhere", c[0].MsgID) ||
		scalar[string](t, db.Pool, `select status || attempts_count from pgflow.step_tasks where run_id = $1::uuid and step_slug = 'a'`, run) != "queued1" {
		t.Errorf("released task is not queued with 1 attempt and a visible message")
	}

	// requeue_stalled_tasks: a long-started task's message becomes visible.
	c = claimTasks(t, db.Pool, "elsewhere", w, 10)
	exec(t, db.Pool, `update pgflow.step_tasks set started_at = now() - interval '1 hour' where run_id = $1::uuid`, run)
	if n := scalar[int](t, db.Pool, `select pgflow.requeue_stalled_tasks()`); n != 1 || !visible(t, db.Pool, "elsewhere", c[0].MsgID) {
		t.Errorf("requeue_stalled_tasks = %d; message visible = %v", n, visible(t, db.Pool, "elsewhere", c[0].MsgID))
	}

	// complete_task archives in the task's queue and starts b there.
	c = claimTasks(t, db.Pool, "elsewhere", w, 10)
	exec(t, db.Pool, `select count(*) from pgflow.complete_task($1::uuid, 'a', 0, '"A"')`, run)
	if !archived(t, db.Pool, "elsewhere", c[0].MsgID) {
		t.Errorf("complete_task did not archive message %d in queue elsewhere", c[0].MsgID)
	}
	c = claimTasks(t, db.Pool, "elsewhere", w, 10)
	if len(c) != 1 || *c[0].Step != "b" || *c[0].Input != `{"a": "A"}` {
		t.Fatalf("claims after a = %+v, want b with {a: A}", c)
	}
	exec(t, db.Pool, `select count(*) from pgflow.complete_task($1::uuid, 'b', 0, '"B"')`, run)
	if s := scalar[string](t, db.Pool, `select status from pgflow.runs where run_id = $1::uuid`, run); s != "completed" {
		t.Errorf("run status = %s, want completed", s)
	}

	// prune: the old run's archived messages... and its rows go; delete: the queue goes.
	exec(t, db.Pool, `update pgflow.runs set completed_at = now() - interval '2 days'`)
	exec(t, db.Pool, `select pgflow.prune_data_older_than(interval '1 day')`)
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks`); n != 0 {
		t.Errorf("prune left %d tasks", n)
	}
	exec(t, db.Pool, `select pgflow.delete_flow_and_data('f')`)
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgmq.list_queues() where queue_name = 'elsewhere'`); n != 0 {
		t.Errorf("delete_flow_and_data left queue elsewhere")
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.flows`); n != 0 {
		t.Errorf("delete_flow_and_data left the flow")
	}
	_ = ctx
}

// A 3-step flow (a; b maps a's output; c after b) completes end to end
// through claim_tasks and complete_task, with the inputs each step needs.
func TestEndToEndThroughClaimTasks(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	shape := `{"steps": [{"slug": "a"}, {"slug": "b", "stepType": "map", "dependencies": ["a"]},
		{"slug": "c", "dependencies": ["b"]}]}`
	exec(t, db.Pool, `select pgflow.ensure_flow_compiled('e2e', $1::jsonb, false)`, shape)
	run := startFlow(t, db.Pool, "e2e", `{"n": 3}`)
	w := worker(t, db.Pool, "e2e")
	outputs := map[string]func(c claim) string{
		"a": func(claim) string { return `[10, 20, 30]` },
		"b": func(c claim) string { return *c.Input + "1" }, // 10 -> 101
		"c": func(c claim) string { return *c.Input },
	}
	// The first claim polls (read_with_poll); messages are there, so it returns at once.
	first, err := tryClaimPoll(db.Pool, "e2e", w)
	if err != nil || len(first) != 1 || *first[0].Step != "a" {
		t.Fatalf("polling claim = %+v, %v; want step a", first, err)
	}
	exec(t, db.Pool, `select pgflow.release_task($1::uuid, 'a', 0, $2::uuid)`, run, w)
	var inputs []string
	for i := 0; i < 10; i++ {
		got := claimTasks(t, db.Pool, "e2e", w, 10)
		if len(got) == 0 {
			break
		}
		for _, c := range got {
			if c.Kind != "claimed" {
				t.Fatalf("unexpected %+v", c)
			}
			inputs = append(inputs, *c.Step+"="+*c.Input)
			exec(t, db.Pool, `select count(*) from pgflow.complete_task($1::uuid, $2, $3, $4::jsonb)`,
				*c.Run, *c.Step, *c.Index, outputs[*c.Step](c))
		}
	}
	sort.Strings(inputs)
	want := []string{`a={"n": 3}`, "b=10", "b=20", "b=30", `c={"b": [101, 201, 301]}`}
	if strings.Join(inputs, " ") != strings.Join(want, " ") {
		t.Errorf("handler inputs = %v, want %v", inputs, want)
	}
	if out := scalar[string](t, db.Pool, `select status || ' ' || output::text from pgflow.runs where run_id = $1::uuid`, run); out != `completed {"c": {"b": [101, 201, 301]}}` {
		t.Errorf("run = %s", out)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgmq.q_e2e`); n != 0 {
		t.Errorf("%d messages left in the queue", n)
	}
}

// prune_data_older_than deletes an old finished run's messages from the
// task's own queue (never archiving them) and skips queues pgmq does not
// list; delete_flow_and_data works when the queue is already gone.
func TestPruneAndDeleteUseListedQueues(t *testing.T) {
	db := testdb.Model(t)
	applyMigration(t, db.Pool)
	exec(t, db.Pool, `select pgflow.ensure_flow_compiled('p', '{"steps": [{"slug": "items", "stepType": "map"}]}'::jsonb, false)`)
	oldRun := startFlow(t, db.Pool, "p", `[1, 2]`)
	newRun := startFlow(t, db.Pool, "p", `[3]`)
	// An old run that failed while its messages were still queued.
	exec(t, db.Pool, `update pgflow.runs set status = 'failed', failed_at = now() - interval '2 days' where run_id = $1::uuid`, oldRun)
	rows, _ := db.Pool.Query(context.Background(), `select message_id from pgflow.step_tasks where run_id = $1::uuid`, oldRun)
	oldMsgs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(oldMsgs) != 2 {
		t.Fatalf("old run messages %v: %v", oldMsgs, err)
	}
	// A task pointing at a queue pgmq does not list must not stop the prune.
	exec(t, db.Pool, `update pgflow.step_tasks set queue_name = 'nowhere' where run_id = $1::uuid and task_index = 1`, oldRun)

	exec(t, db.Pool, `select pgflow.prune_data_older_than(interval '1 day')`)
	if !scalar[bool](t, db.Pool, `select not exists (select 1 from pgmq.q_p where msg_id = $1) and not exists (select 1 from pgmq.a_p where msg_id = $1)`, oldMsgs[0]) {
		t.Errorf("old run's message %d was not deleted from queue p", oldMsgs[0])
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where run_id = $1::uuid`, oldRun); n != 0 {
		t.Errorf("prune left %d tasks of the old run", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.step_tasks where run_id = $1::uuid`, newRun); n != 1 {
		t.Errorf("prune touched the new run: %d tasks left, want 1", n)
	}

	exec(t, db.Pool, `select pgmq.drop_queue('p')`)
	exec(t, db.Pool, `select pgflow.delete_flow_and_data('p')`)
	if n := scalar[int](t, db.Pool, `select count(*)::int from pgflow.runs`); n != 0 {
		t.Errorf("delete_flow_and_data left %d runs", n)
	}
}

// Run by hand, the file never waits for one table while holding another: an
// application transaction that holds a run and then needs flows (as
// complete_task does through the step_tasks FK) is not deadlocked, and the
// migration goes through once it commits.
func TestMigrationLocksNeverDeadlock(t *testing.T) {
	db := testdb.Model(t)
	ctx := context.Background()
	exec(t, db.Pool, `select pgflow.create_flow('f')`)
	exec(t, db.Pool, `select pgflow.add_step('f', 'a')`)
	run := startFlow(t, db.Pool, "f", `{}`)

	app, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx)
	exec(t, app, `select 1 from pgflow.runs where run_id = $1::uuid for update`, run)
	appPID := scalar[int](t, app, `select pg_backend_pid()`)

	migrated := make(chan error, 1)
	go func() { migrated <- tryMigration(db.Pool) }()
	// Signal, not time: wait until the migration is held up by the run
	// (backing off in pg_sleep, or queued for a lock).
	for {
		n := scalar[int](t, db.Pool, `select count(*)::int from pg_stat_activity
			where datname = current_database() and pid <> $1
			  and (wait_event = 'PgSleep' or wait_event_type = 'Lock')`, appPID)
		if n > 0 {
			break
		}
		select {
		case err := <-migrated:
			t.Fatalf("migration finished while the run was held: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The application now needs flows: with a migration holding flows while
	// waiting for runs this would deadlock.
	if _, err := app.Exec(ctx, `select 1 from pgflow.flows where flow_slug = 'f' for key share`); err != nil {
		t.Fatalf("application blocked out by the migration: %v", err)
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatalf("application commit: %v", err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("migration after the application committed: %v", err)
	}
	if v := scalar[int](t, db.Pool, `select pgflow.queue_protocol_version()`); v != 2 {
		t.Errorf("queue_protocol_version() = %d", v)
	}
}
