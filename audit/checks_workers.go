package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// workersLegacyAlive is workers.legacy_alive.
var workersLegacyAlive = Check{
	ID: "workers.legacy_alive", Title: "0.16.0 workers still alive", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow,
	Meaning: "Workers not stopped or deprecated with a recent heartbeat, on a 0.16.0 schema. A 0.16.0 worker still starts, registers and heartbeats on 0.17.0, " +
		"then fails at its first non-empty claim with 42883 (start_tasks(flow_slug, msg_ids, worker_id) no longer exists): it claims nothing and its messages " +
		"come back after their visibility timeout, so nothing is lost, but nothing runs either.",
	Remedy: "Stop them first (runbook, \"Stop the 0.16.0 workers\"): record and disable pgflow.worker_functions.enabled so ensure_workers does not restart them, " +
		"stop process workers and their supervisors, wait until no task is 'started', apply, then deploy 0.17.0 workers and restore enabled.",
	Run: checkLegacyWorkers,
}

func checkLegacyWorkers(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	if env.Schema.State == versions.SchemaUpgraded {
		return nil, nil // no 0.16.0 worker can claim here; live ones are 0.17's
	}
	live := env.LiveWorker
	if live <= 0 {
		live = time.Minute
	}
	var n int64
	var samples []map[string]any
	err := scanTable(ctx, q, "workers", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with w as (
		  select w.worker_id, w.queue_name, w.function_name, w.started_at, w.last_heartbeat_at
		  from pgflow.workers w
		  where w.stopped_at is null and w.deprecated_at is null
		    and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $2)
		)
		select (select pg_catalog.count(*) from w),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('worker_id', w.worker_id, 'queue', w.queue_name, 'function_name', w.function_name,
		                  'started_at', w.started_at, 'heartbeat_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - w.last_heartbeat_at)))
		         from w order by w.last_heartbeat_at desc, w.worker_id limit $1))`, env.Sample, live.Seconds()).Scan(&n, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("reading live workers from pgflow.workers: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d 0.16.0 worker(s) alive (not stopped or deprecated, heartbeat within %s)", n, live), samples)}, nil
}
