package audit

import (
	"context"
	"fmt"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// tasks.duplicate_message_id answers exactly whether the 0.17.0 unique
// index on step_tasks (queue_name, message_id) WHERE message_id IS NOT NULL
// can be built, where the migration fills queue_name with lower(flow_slug).
//
// Two rows of one pair share their message_id, so the question splits
// cleanly by message_id range: the check walks step_tasks through
// idx_step_tasks_message_id in ranges of about Env.Bound rows and groups
// each range on its own. Every range is one statement (a few hundred ms at
// the default bound), each under what is left of the check's budget; when
// the budget runs out the check is inconclusive and says how many rows the
// finished ranges held. Ranges also keep each GROUP BY in memory: one GROUP
// BY over 5M rows spills to disk at any sane work_mem (BENCHMARKS.md,
// "audit at 5M").

// dupChunkSQL groups one message-id range: rows, duplicate pairs, and the
// tasks in them.
const dupChunkSQL = `
select coalesce(pg_catalog.sum(g.tasks), 0)::bigint,
       pg_catalog.count(*) filter (where g.tasks > 1),
       coalesce(pg_catalog.sum(g.tasks) filter (where g.tasks > 1), 0)::bigint
from (
  select pg_catalog.lower(t.flow_slug) as queue, t.message_id, pg_catalog.count(*) as tasks
  from pgflow.step_tasks t
  where t.message_id >= $1 and t.message_id <= $2
  group by 1, 2
) g`

// dupSampleSQL lists the duplicate pairs of one range, at most $3.
const dupSampleSQL = `
select pg_catalog.jsonb_build_object('queue', g.queue, 'message_id', g.message_id::text, 'tasks', g.tasks,
         'flow_slugs', pg_catalog.array_to_string(g.slugs, ', '), 'runs', g.runs)
from (
  select pg_catalog.lower(t.flow_slug) as queue, t.message_id, pg_catalog.count(*) as tasks,
         pg_catalog.array_agg(distinct t.flow_slug) as slugs,
         (pg_catalog.array_agg(distinct t.run_id::text))[1:3] as runs
  from pgflow.step_tasks t
  where t.message_id >= $1 and t.message_id <= $2
  group by 1, 2
  having pg_catalog.count(*) > 1
) g
order by g.queue, g.message_id
limit $3`

// dupRangeLimit, when > 0, makes the check stop as if its budget ran out
// after that many ranges: a test hook (export_test.go), so the inconclusive
// path is tested without depending on how fast the machine is.
var dupRangeLimit int

// scale is n*num/den in floating point (ids can be near 2^63), at least 1.
func scale(n, num, den int64) int64 {
	v := float64(n) * float64(num) / float64(den)
	if v < 1 {
		return 1
	}
	if v > float64(1<<62) {
		return 1 << 62
	}
	return int64(v)
}

// sampleRowsOf runs a query of single jsonb rows and keeps at most n.
func sampleRowsOf(ctx context.Context, q Querier, n int, sql string, args ...any) ([]map[string]any, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var m map[string]any
		if err := rows.Scan(&m); err != nil {
			return nil, err
		}
		if len(out) < n {
			out = append(out, m)
		}
	}
	return out, rows.Err()
}

// tasksDuplicateMessageID is tasks.duplicate_message_id.
var tasksDuplicateMessageID = Check{
	ID: "tasks.duplicate_message_id", Title: "tasks sharing one (queue, message id)", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow,
	Meaning: "0.17.0 fills step_tasks.queue_name with lower(flow_slug) and creates a unique index on (queue_name, message_id) where message_id is not null; " +
		"the migration fails while two tasks share a pair (e.g. after a queue was dropped and recreated, restarting its ids). " +
		"Exact: every row with a message id is examined, in message-id ranges of --bound rows.",
	Remedy: "Decide which task owns the message; set message_id = null on finished tasks that no longer need it (or delete their old runs), then audit again.",
	Run:    checkDuplicateMessageID,
}

func checkDuplicateMessageID(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	if env.Schema.State == versions.SchemaUpgraded {
		return nil, nil // idx_step_tasks_queue_message exists: no pair can repeat
	}
	var pairs, tasks int64
	var samples []map[string]any
	err := scanTable(ctx, q, "step_tasks", func(estimate int64) (int64, error) {
		var examined int64
		// Each range is grouped by sorting (measured faster than a hash
		// table of as many groups as rows), in memory: a sort of about
		// Bound rows fits in 64MB. SET LOCAL: gone with the transaction or
		// savepoint.
		if err := (session.Planner{WorkMem: "64MB", NoHashAgg: true}).Set(ctx, q); err != nil {
			return 0, fmt.Errorf("setting work_mem: %w", err)
		}
		var lo, hi *int64
		if err := q.QueryRow(ctx, `select pg_catalog.min(t.message_id), pg_catalog.max(t.message_id) from pgflow.step_tasks t`).Scan(&lo, &hi); err != nil {
			return 0, err
		}
		if lo == nil {
			return 0, nil // no task has a message id
		}
		target := env.chunkRows()
		width := *hi - *lo + 1
		span := width // one range unless the table is bigger than a range
		if estimate > target {
			span = scale(width, target, estimate)
			// Several ranges: each read through the message_id index, never
			// by a sequential scan of the whole table per range.
			if err := (session.Planner{NoSeqScan: true}).Set(ctx, q); err != nil {
				return 0, fmt.Errorf("setting enable_seqscan: %w", err)
			}
		}
		for n, from := 0, *lo; from <= *hi; n++ {
			if err := tighten(ctx, q, env); err != nil {
				return examined, err
			}
			if dupRangeLimit > 0 && n >= dupRangeLimit {
				return examined, errBudget // test hook: the budget "ran out" here
			}
			to := *hi
			if span <= *hi-from {
				to = from + span - 1
			}
			var rows, p, t int64
			if err := q.QueryRow(ctx, dupChunkSQL, from, to).Scan(&rows, &p, &t); err != nil {
				return examined, err
			}
			if p > 0 && len(samples) < env.Sample {
				more, err := sampleRowsOf(ctx, q, env.Sample-len(samples), dupSampleSQL, from, to, env.Sample-len(samples))
				if err != nil {
					return examined, err
				}
				samples = append(samples, more...)
			}
			examined += rows
			pairs += p
			tasks += t
			// Steer the next range toward target rows (ids are not evenly
			// spread: every queue has its own sequence).
			next := scale(span, 4, 1)
			if rows > 0 {
				next = max(span/4, min(next, scale(span, target, rows)))
			}
			span = max(1, min(next, width))
			if to == *hi {
				break
			}
			from = to + 1
		}
		return examined, nil
	})
	if err != nil {
		return nil, fmt.Errorf("looking for tasks that share a (queue, message id) pair: %w", err)
	}
	if pairs == 0 {
		return nil, nil
	}
	return []Finding{c.finding(pairs, fmt.Sprintf("%d (queue, message id) pair(s) owned by more than one task (%d tasks): "+
		"the unique index on (queue_name, message_id) cannot be built", pairs, tasks), samples)}, nil
}
