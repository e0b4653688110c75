package migrations_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A slow worker's late success report for a task that requeue_stalled_tasks
// already put back to queued changes nothing and leaves the task's message
// in its queue: another worker claims it, completes it, and the run ends.
// (Archiving the message there would leave a queued task nothing can claim,
// and a run that never ends.)
func TestLateCompletionAfterRequeueKeepsTheMessage(t *testing.T) {
	onEachPath(t, func(t *testing.T, p *pgxpool.Pool) {
		testdb.Exec(t, p, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'late_flow', 'fn')`, workerID)
		testdb.Exec(t, p, `select pgflow.create_flow('late_flow')`)
		testdb.Exec(t, p, `select pgflow.add_step('late_flow', 'only')`)
		run := scalar[string](t, p, `select run_id::text from pgflow.start_flow('late_flow', '{}')`)
		ids := scalar[[]int64](t, p, `select array_agg(msg_id) from pgmq.read('late_flow', 30, 10)`)
		if len(ids) != 1 {
			t.Fatalf("read %d messages, want 1", len(ids))
		}
		if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('late_flow', $1, $2::uuid, 'late_flow')`, ids, workerID); n != 1 {
			t.Fatalf("claimed %d, want 1", n)
		}
		// The worker goes silent for longer than the timeout + 30 s.
		testdb.Exec(t, p, `update pgflow.step_tasks set queued_at = now() - interval '2 hours', started_at = now() - interval '1 hour' where run_id = $1::uuid`, run)
		if n := scalar[int](t, p, `select pgflow.requeue_stalled_tasks()`); n != 1 {
			t.Fatalf("requeue_stalled_tasks requeued %d, want 1", n)
		}

		// Its report arrives late.
		row := scalar[string](t, p, `select status from pgflow.complete_task($1::uuid, 'only', 0, '"late"')`, run)
		if row != "queued" {
			t.Fatalf("the late report left the task %s, want queued", row)
		}
		if n := scalar[int](t, p, `select count(*) from pgmq.q_late_flow where msg_id = $1`, ids[0]); n != 1 {
			t.Fatal("the late report removed the message of a queued task")
		}
		if n := scalar[int](t, p, `select count(*) from pgmq.a_late_flow`); n != 0 {
			t.Fatalf("%d messages archived by the late report, want 0", n)
		}

		// The message is claimable again; the second attempt completes the run.
		again := scalar[[]int64](t, p, `select coalesce(array_agg(msg_id), '{}') from pgmq.read('late_flow', 30, 10)`)
		if len(again) != 1 || again[0] != ids[0] {
			t.Fatalf("read %v after the late report, want [%d]", again, ids[0])
		}
		if n := scalar[int](t, p, `select count(*) from pgflow.start_tasks('late_flow', $1, $2::uuid, 'late_flow')`, again, workerID); n != 1 {
			t.Fatalf("claimed %d on the second attempt, want 1", n)
		}
		testdb.Exec(t, p, `select count(*) from pgflow.complete_task($1::uuid, 'only', 0, '"on time"')`, run)
		if st := scalar[string](t, p, `select status || ' ' || output::text from pgflow.runs where run_id = $1::uuid`, run); st != `completed {"only": "on time"}` {
			t.Fatalf("run %s, want completed with the second attempt's output", st)
		}
		if n := scalar[int](t, p, `select count(*) from pgmq.a_late_flow where msg_id = $1`, ids[0]); n != 1 {
			t.Fatal("the completing report did not archive the message")
		}
		// A duplicate report for the completed task changes nothing.
		testdb.Exec(t, p, `select count(*) from pgflow.complete_task($1::uuid, 'only', 0, '"again"')`, run)
		if st := scalar[string](t, p, `select status || ' ' || output::text from pgflow.step_tasks where run_id = $1::uuid`, run); st != `completed "on time"` {
			t.Fatalf("a duplicate report changed the task: %s", st)
		}
	})
}
