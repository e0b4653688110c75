package quiesce

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// UpstreamCronJobs are the jobs pgflow 0.16.0's setup_*_cron functions
// schedule, and the telemetry report 0.17.1's migration schedules (its
// command calls pgflow_telemetry.*, which the pattern below does not
// match). Besides them, any job whose command calls pgflow.* (a pruning
// job, say) is a pgflow writer and is paused too.
var UpstreamCronJobs = []string{"pgflow_ensure_workers", "pgflow_cleanup_logs", "pgflow_requeue_stalled_tasks", "pgflow_telemetry_report"}

// DefaultLiveWorker: a worker whose heartbeat is more recent is alive (as
// the audit's workers.legacy_alive: 12 heartbeats of the 0.16.0 worker).
const DefaultLiveWorker = time.Minute

// Function is a row of pgflow.worker_functions.
type Function struct {
	Name      string `json:"function_name"`
	StartMode string `json:"start_mode"`
	Enabled   bool   `json:"enabled"`
}

// CronJob is a pgflow job of pg_cron.
type CronJob struct {
	JobID    int64  `json:"jobid"`
	Name     string `json:"jobname"`
	Schedule string `json:"schedule"`
	Command  string `json:"command"`
	Active   bool   `json:"active"`
	// Owner is the job's username: pg_cron lets only its owner or a
	// superuser alter it.
	Owner string `json:"username"`
}

// Worker is a live 0.16.0 worker.
type Worker struct {
	ID            string    `json:"worker_id"`
	Function      string    `json:"function_name"`
	Queue         string    `json:"queue"`
	LastHeartbeat time.Time `json:"last_heartbeat_at"`
	Deprecated    bool      `json:"deprecated"`
}

// Inventory is what a quiesce would touch (and what it waits for).
type Inventory struct {
	Functions []Function `json:"functions"`
	// Cron: pg_cron is installed (schema cron with table cron.job);
	// AlterJob: it has cron.alter_job, the only way the jobs are paused.
	Cron     bool      `json:"pg_cron"`
	AlterJob bool      `json:"cron_alter_job"`
	CronJobs []CronJob `json:"cron_jobs"`
	// CronUnreadable: why the jobs could not be listed (audit role).
	CronUnreadable string `json:"cron_unreadable,omitempty"`
	// CronRole is the role the jobs are read and altered as; CronSuperuser:
	// it may alter any job; CronOwnOnly: row-level security on cron.job
	// shows this role only the jobs it owns (pg_cron's policy).
	CronRole      string `json:"cron_role,omitempty"`
	CronSuperuser bool   `json:"cron_superuser,omitempty"`
	CronOwnOnly   bool   `json:"cron_own_jobs_only,omitempty"`
	// OtherDatabaseJobs are pgflow-looking jobs pg_cron runs in another
	// database: another installation's, never paused here.
	OtherDatabaseJobs []CronJob `json:"other_database_cron_jobs,omitempty"`
	Workers           []Worker  `json:"live_workers"`
	// StartedTasks: tasks in 'started'; ByLiveWorkers: those a live worker holds.
	StartedTasks  int64 `json:"started_tasks"`
	ByLiveWorkers int64 `json:"started_by_live_workers"`
}

// Changes lists, one line each, what Pause and Deprecate would change.
func (inv Inventory) Changes() []string {
	var out []string
	for _, f := range inv.Functions {
		if f.Enabled {
			out = append(out, fmt.Sprintf("worker function %s (%s): enabled true -> false (recorded, restored to true)", f.Name, f.StartMode))
		} else {
			out = append(out, fmt.Sprintf("worker function %s (%s): already disabled (recorded, stays false)", f.Name, f.StartMode))
		}
	}
	for _, j := range inv.CronJobs {
		if j.Active {
			out = append(out, fmt.Sprintf("cron job %d %s (%s): active true -> false via cron.alter_job (recorded, restored to true)", j.JobID, j.Name, j.Schedule))
		} else {
			out = append(out, fmt.Sprintf("cron job %d %s: already inactive (recorded, stays inactive)", j.JobID, j.Name))
		}
	}
	for _, j := range inv.OtherDatabaseJobs {
		out = append(out, fmt.Sprintf("cron job %d %s runs in another database: not this database's, left as it is", j.JobID, j.Name))
	}
	if !inv.Cron {
		out = append(out, "pg_cron is not installed: no cron job to pause")
	}
	for _, w := range inv.Workers {
		if !w.Deprecated {
			out = append(out, fmt.Sprintf("worker %s (%s, queue %s, last heartbeat %s): deprecated_at set (it stops polling; not restored)",
				w.ID, w.Function, w.Queue, w.LastHeartbeat.UTC().Format(time.RFC3339)))
		}
	}
	out = append(out, fmt.Sprintf("then wait for %d task(s) started by live workers (%d started in all) to finish", inv.ByLiveWorkers, inv.StartedTasks))
	return out
}

// Blocked says why Pause cannot pause the cron jobs ("" when it can).
func (inv Inventory) Blocked() string {
	if !inv.Cron {
		return ""
	}
	if inv.CronOwnOnly && !inv.seesUpstreamJob() {
		return fmt.Sprintf("role %s sees only the pg_cron jobs it owns (row-level security on cron.job) and none of pgflow's "+
			"(%s): they cannot be paused as this role; run apply --quiesce as the role that scheduled them "+
			"(the one pgflow's migrations ran as) or as a superuser, or pause them yourself (docs/runbook.md) and rerun",
			inv.CronRole, strings.Join(UpstreamCronJobs, ", "))
	}
	for _, j := range inv.CronJobs {
		if !j.Active {
			continue
		}
		if !inv.AlterJob {
			return "pg_cron has no cron.alter_job (pg_cron older than 1.4?): the pgflow cron jobs cannot be paused through pg_cron's API; " +
				"upgrade pg_cron, or pause them yourself (docs/runbook.md) and rerun"
		}
		if !inv.CronSuperuser && j.Owner != inv.CronRole {
			return fmt.Sprintf("cron job %d (%s) belongs to role %s, and pg_cron lets only a job's owner or a superuser alter it: "+
				"run apply --quiesce as %s or as a superuser, or pause it yourself (docs/runbook.md) and rerun",
				j.JobID, j.Name, j.Owner, j.Owner)
		}
	}
	return ""
}

func (inv Inventory) seesUpstreamJob() bool {
	for _, j := range inv.CronJobs {
		if slices.Contains(UpstreamCronJobs, j.Name) {
			return true
		}
	}
	return false
}

// TakeInventory reads what a quiesce would touch; read-only.
func TakeInventory(ctx context.Context, q Querier, live time.Duration) (Inventory, error) {
	if live <= 0 {
		live = DefaultLiveWorker
	}
	var inv Inventory
	rows, err := q.Query(ctx, `select function_name, start_mode, enabled from pgflow.worker_functions order by function_name`)
	if err != nil {
		return inv, fmt.Errorf("reading pgflow.worker_functions: %w", err)
	}
	if inv.Functions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Function]); err != nil {
		return inv, fmt.Errorf("reading pgflow.worker_functions: %w", err)
	}
	if inv.Cron, inv.AlterJob, err = cronAPI(ctx, q); err != nil {
		return inv, err
	}
	if inv.Cron {
		var readable bool
		if err := q.QueryRow(ctx, `select pg_catalog.has_schema_privilege('cron', 'USAGE')
		                              and pg_catalog.has_table_privilege('cron.job', 'SELECT')`).Scan(&readable); err != nil {
			return inv, fmt.Errorf("checking access to cron.job: %w", err)
		}
		if !readable {
			// A read-only auditor may not see pg_cron; apply's role must.
			inv.CronUnreadable = "this role may not read cron.job (no USAGE on schema cron or SELECT on cron.job)"
		} else {
			if err := q.QueryRow(ctx, `
				select current_user::text, r.rolsuper,
				       c.relrowsecurity and not (r.rolsuper or r.rolbypassrls)
				  from pg_catalog.pg_roles r, pg_catalog.pg_class c
				 where r.rolname = current_user and c.oid = 'cron.job'::pg_catalog.regclass`).
				Scan(&inv.CronRole, &inv.CronSuperuser, &inv.CronOwnOnly); err != nil {
				return inv, fmt.Errorf("reading this role's rights on cron.job: %w", err)
			}
			all, err := cronJobs(ctx, q)
			if err != nil {
				return inv, err
			}
			inv.CronJobs, inv.OtherDatabaseJobs = splitByDatabase(all)
		}
	}
	rows, err = q.Query(ctx, `
		select w.worker_id::text, w.function_name, w.queue_name, w.last_heartbeat_at, w.deprecated_at is not null
		  from pgflow.workers w
		 where w.stopped_at is null and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $1)
		 order by w.function_name, w.worker_id`, live.Seconds())
	if err != nil {
		return inv, fmt.Errorf("reading live workers from pgflow.workers: %w", err)
	}
	if inv.Workers, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Worker]); err != nil {
		return inv, fmt.Errorf("reading live workers from pgflow.workers: %w", err)
	}
	if err := q.QueryRow(ctx, `
		select pg_catalog.count(*),
		       pg_catalog.count(*) filter (where exists (
		         select 1 from pgflow.workers w
		          where w.worker_id = t.last_worker_id and w.stopped_at is null
		            and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $1)))
		  from pgflow.step_tasks t where t.status = 'started'`, live.Seconds()).Scan(&inv.StartedTasks, &inv.ByLiveWorkers); err != nil {
		return inv, fmt.Errorf("counting started tasks in pgflow.step_tasks: %w", err)
	}
	return inv, nil
}

// cronAPI: is pg_cron there (cron.job), and does it have cron.alter_job
// with pg_cron's signature?
func cronAPI(ctx context.Context, q Querier) (cron, alter bool, err error) {
	// From the catalogs: to_regclass would need USAGE on schema cron.
	err = q.QueryRow(ctx, `
		select exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		                where n.nspname = 'cron' and c.relname = 'job' and c.relkind in ('r', 'p', 'v')),
		       exists (select 1 from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
		                where n.nspname = 'cron' and p.proname = 'alter_job'
		                  and p.proargtypes = '20 25 25 25 25 16'::pg_catalog.oidvector)`).Scan(&cron, &alter) // alter_job(bigint, text, text, text, text, boolean)
	if err != nil {
		return false, false, fmt.Errorf("looking for pg_cron (cron.job, cron.alter_job): %w", err)
	}
	return cron, alter, nil
}

// cronJob is a row of cronJobs: a job and whether pg_cron runs it in this
// database.
type cronJob struct {
	CronJob
	Here bool
}

// cronJobs lists pgflow's jobs: upstream's three by name, and any other job
// whose command calls a pgflow function, with whether each runs in this
// database (pg_cron keeps every database's jobs in the one database it runs
// in).
func cronJobs(ctx context.Context, q Querier) ([]cronJob, error) {
	rows, err := q.Query(ctx, `
		select j.jobid, coalesce(j.jobname, ''), j.schedule, j.command, j.active, j.username::text,
		       j.database = pg_catalog.current_database()
		  from cron.job j
		 where j.jobname = any($1::text[]) or j.command ~* '\mpgflow\s*\.'
		 order by j.jobid`, UpstreamCronJobs)
	if err != nil {
		return nil, fmt.Errorf("reading pgflow's jobs from cron.job: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (cronJob, error) {
		var j cronJob
		err := row.Scan(&j.JobID, &j.Name, &j.Schedule, &j.Command, &j.Active, &j.Owner, &j.Here)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading pgflow's jobs from cron.job: %w", err)
	}
	return jobs, nil
}

// splitByDatabase separates the jobs of this database (paused by a
// quiesce) from those pg_cron runs in another one (left alone).
func splitByDatabase(jobs []cronJob) (here, elsewhere []CronJob) {
	for _, j := range jobs {
		if j.Here {
			here = append(here, j.CronJob)
		} else {
			elsewhere = append(elsewhere, j.CronJob)
		}
	}
	return here, elsewhere
}
