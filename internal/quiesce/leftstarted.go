package quiesce

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// What the quiesce leaves started. The drain waits for the tasks of live
// workers only: a task whose worker died (no heartbeat within LiveWorker,
// or stopped) is never finished by it, and the upgrade commits with the
// task still 'started'. Nothing is lost: pgflow's stalled-task recovery
// (pgflow.requeue_stalled_tasks(), which upstream schedules as the cron
// job pgflow_requeue_stalled_tasks) requeues such a task once its
// started_at is older than its step's timeout (or its flow's) plus 30
// seconds, at most 3 times per task; after that it archives the message
// and leaves the task started. The operator is told how many, whose, since
// when, and when recovery takes them.

// RequeueJob is the cron job upstream's setup_requeue_stalled_tasks_cron()
// schedules.
const RequeueJob = "pgflow_requeue_stalled_tasks"

// maxRequeues is requeue_stalled_tasks()'s own limit: a task requeued that
// many times is no longer requeued.
const maxRequeues = 3

// LeftStarted is what was still started when the upgrade committed.
type LeftStarted struct {
	Tasks   int64             `json:"tasks"`
	Workers []StartedByWorker `json:"workers"`
	// RequeueJob: the cron job that runs the recovery is on this
	// database (paused with the others during the upgrade, then restored).
	RequeueJob bool `json:"requeue_job"`
	// Recovery says what becomes of the tasks.
	Recovery string `json:"recovery"`
}

// StartedByWorker is the started tasks of one worker.
type StartedByWorker struct {
	WorkerID      string     `json:"worker_id,omitempty"`
	Function      string     `json:"function_name,omitempty"`
	LastHeartbeat *time.Time `json:"last_heartbeat_at,omitempty"`
	Tasks         int64      `json:"tasks"`
	OldestStarted time.Time  `json:"oldest_started_at"`
	// RequeueFrom: the first of them recovery may requeue from then on.
	RequeueFrom time.Time `json:"requeue_from"`
	// Exhausted: requeued maxRequeues times already (or marked
	// permanently stalled): recovery archives or leaves them.
	Exhausted int64 `json:"requeues_exhausted"`
}

// ReadLeftStarted reads the tasks in 'started' that no live worker holds
// (live: a heartbeat within live, not stopped), by worker, and whether the
// recovery's cron job exists. After the drain these are all the started
// tasks.
func ReadLeftStarted(ctx context.Context, q Querier, live time.Duration) (*LeftStarted, error) {
	rows, err := q.Query(ctx, `
		select coalesce(t.last_worker_id::pg_catalog.text, ''), coalesce(w.function_name, ''), w.last_heartbeat_at,
		       pg_catalog.count(*), pg_catalog.min(t.started_at),
		       pg_catalog.min(t.started_at + coalesce(s.opt_timeout, f.opt_timeout) * interval '1 second' + interval '30 seconds'),
		       pg_catalog.count(*) filter (where t.requeued_count >= $1 or t.permanently_stalled_at is not null)
		  from pgflow.step_tasks t
		  join pgflow.runs r on r.run_id = t.run_id
		  join pgflow.steps s on s.flow_slug = r.flow_slug and s.step_slug = t.step_slug
		  join pgflow.flows f on f.flow_slug = r.flow_slug
		  left join pgflow.workers w on w.worker_id = t.last_worker_id
		 where t.status = 'started'
		   and not (w.stopped_at is null and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $2)) is true
		 group by 1, 2, 3
		 order by pg_catalog.min(t.started_at)`, maxRequeues, live.Seconds())
	if err != nil {
		return nil, fmt.Errorf("reading the tasks still started: %w", err)
	}
	defer rows.Close()
	out := &LeftStarted{Workers: []StartedByWorker{}}
	for rows.Next() {
		var w StartedByWorker
		if err := rows.Scan(&w.WorkerID, &w.Function, &w.LastHeartbeat, &w.Tasks, &w.OldestStarted, &w.RequeueFrom, &w.Exhausted); err != nil {
			return nil, fmt.Errorf("reading the tasks still started: %w", err)
		}
		out.Tasks += w.Tasks
		out.Workers = append(out.Workers, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the tasks still started: %w", err)
	}
	if out.RequeueJob, err = requeueJobExists(ctx, q); err != nil {
		return nil, err
	}
	out.Recovery = out.recovery()
	return out, nil
}

// recovery says what becomes of the tasks.
func (l *LeftStarted) recovery() string {
	if l.Tasks == 0 {
		return ""
	}
	var exhausted int64
	first := l.Workers[0].RequeueFrom
	for _, w := range l.Workers {
		exhausted += w.Exhausted
		if w.RequeueFrom.Before(first) {
			first = w.RequeueFrom
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "their workers are gone (the drain waits only for live workers), so nothing finishes them now; nothing is lost: "+
		"pgflow's stalled-task recovery, pgflow.requeue_stalled_tasks(), puts a started task back in its queue once its started_at is older than its step's timeout plus 30 s "+
		"(the first of these from %s), at most %d times per task", first.UTC().Format(time.RFC3339), maxRequeues)
	if exhausted > 0 {
		fmt.Fprintf(&b, "; %d of them were requeued %d times already, so recovery archives their messages and leaves them started (fail or retry those runs yourself)", exhausted, maxRequeues)
	}
	if l.RequeueJob {
		fmt.Fprintf(&b, "; the cron job %s runs it (paused during the upgrade, restored after)", RequeueJob)
	} else {
		b.WriteString("; no cron job runs it on this database: run `select pgflow.requeue_stalled_tasks()` (or schedule it with `select pgflow.setup_requeue_stalled_tasks_cron()`)")
	}
	return b.String()
}

// Summary is one line: how many, how many workers, since when.
func (l *LeftStarted) Summary() string {
	if l == nil || l.Tasks == 0 {
		return ""
	}
	return fmt.Sprintf("%d task(s) were still started when the upgrade committed, by %d worker(s) that are not live (the oldest since %s)",
		l.Tasks, len(l.Workers), l.Workers[0].OldestStarted.UTC().Format(time.RFC3339))
}

// requeueJobExists says whether pg_cron's cron.job holds RequeueJob (false
// without pg_cron, or when this role may not read cron.job).
func requeueJobExists(ctx context.Context, q Querier) (bool, error) {
	var readable bool
	if err := q.QueryRow(ctx, `select case when pg_catalog.to_regclass('cron.job') is null then false
		else pg_catalog.has_table_privilege(pg_catalog.to_regclass('cron.job'), 'select') end`).Scan(&readable); err != nil || !readable {
		return false, err
	}
	var exists bool
	err := q.QueryRow(ctx, `select exists (select from cron.job where jobname operator(pg_catalog.=) $1)`, RequeueJob).Scan(&exists)
	return exists, err
}
