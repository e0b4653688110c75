package migrations_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// start_tasks hides each claimed message for its step's timeout (else the
// flow's) + 2 s, returns the claims in msg_id order, and fails as a whole
// (nothing claimed) when a claimed task's message is gone from the queue,
// with pgflow 0.17.0's deliberate text-to-integer cast failure (22P02).
func TestStartTasksLeaseAndGuard(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	p := db.Pool
	applyMigration(t, p)
	testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'lease_flow', 'fn')`, workerID)
	testdb.Exec(t, p, `select pgflow.create_flow('Lease_Flow', timeout => 40)`)
	testdb.Exec(t, p, `select pgflow.add_step('Lease_Flow', 'a')`)
	testdb.Exec(t, p, `select pgflow.add_step('Lease_Flow', 'b', timeout => 20)`)
	testdb.Exec(t, p, `select pgflow.start_flow('Lease_Flow', '{"n": 1}')`)
	testdb.Exec(t, p, `select pgflow.start_flow('Lease_Flow', '{"n": 2}')`)

	// The guard: one message of the batch deleted behind the worker's back.
	ids := scalar[[]int64](t, p, `select array_agg(msg_id order by msg_id) from pgmq.read('lease_flow', 30, 10)`)
	if len(ids) != 4 {
		t.Fatalf("read %d messages, want 4", len(ids))
	}
	testdb.Exec(t, p, `select pgmq.delete('lease_flow', $1::bigint)`, ids[1])
	_, err := p.Exec(ctx, `select * from pgflow.start_tasks('Lease_Flow', $1, $2::uuid, 'lease_flow')`, ids, workerID)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" ||
		pgErr.Message != `invalid input syntax for type integer: "start_tasks(): visibility updated 3 of 4 claimed messages"` {
		t.Fatalf("claim with a missing message: %v, want 22P02 naming 3 of 4", err)
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.step_tasks where status <> 'queued' or attempts_count <> 0`); n != 0 {
		t.Fatalf("%d tasks changed by the failed claim", n)
	}

	// The lease: the three messages left, each for its own step's timeout.
	rest := []int64{ids[0], ids[2], ids[3]}
	c, err := p.Acquire(ctx) // one session: the temp table below
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	// (The vt is read in a later statement: the claim's own snapshot does
	// not see the update its function made.)
	testdb.Exec(t, c, `create temp table claims as
	    select * from pgflow.start_tasks('Lease_Flow', $1, $2::uuid, 'lease_flow') with ordinality as s(flow_slug, run_id, step_slug, input, msg_id, task_index, flow_input, ord)`,
		rest, workerID)
	rows, err := c.Query(ctx, `select s.msg_id, s.step_slug, s.flow_input->>'n', s.input::text,
	        round(extract(epoch from q.vt - clock_timestamp()))::int
	      from claims s
	      join pgmq.q_lease_flow q on q.msg_id = s.msg_id
	     order by s.ord`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []int64
	for rows.Next() {
		var id int64
		var step, n, input string
		var secs int
		if err := rows.Scan(&id, &step, &n, &input, &secs); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
		want := map[string]int{"a": 42, "b": 22}[step]
		if secs < want-2 || secs > want {
			t.Errorf("message %d (step %s) hidden for %ds, want about %d", id, step, secs, want)
		}
		if input != "{}" || (n != "1" && n != "2") {
			t.Errorf("message %d: input %s, flow input n=%q", id, input, n)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != rest[0] || got[1] != rest[1] || got[2] != rest[2] {
		t.Fatalf("claimed %v, want %v in that order", got, rest)
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.step_tasks where status = 'started' and attempts_count = 1 and last_worker_id = $1::uuid`, workerID); n != 3 {
		t.Fatalf("%d tasks started by the claim, want 3", n)
	}
	// A second claim of the same messages finds their tasks started: no
	// row, no change (the guard reads the locked rows).
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('Lease_Flow', $1, $2::uuid, 'lease_flow')`, rest, workerID); n != 0 {
		t.Fatalf("a second claim returned %d rows, want 0", n)
	}
	if n := scalar[int](t, p, `select count(*) from pgflow.step_tasks where attempts_count > 1`); n != 0 {
		t.Fatalf("%d tasks counted twice", n)
	}
	// A task whose run failed is not claimed either.
	testdb.Exec(t, p, `update pgflow.step_tasks set status = 'queued' where message_id = $1`, rest[0])
	testdb.Exec(t, p, `update pgflow.runs set status = 'failed', failed_at = now() where run_id = (select run_id from pgflow.step_tasks where message_id = $1)`, rest[0])
	if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('Lease_Flow', $1, $2::uuid, 'lease_flow')`, []int64{rest[0]}, workerID); n != 0 {
		t.Fatalf("a task of a failed run was claimed (%d rows)", n)
	}
}
