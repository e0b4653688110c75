package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func liveWindow(env Env) time.Duration {
	if env.LiveWorker > 0 {
		return env.LiveWorker
	}
	return quiesce.DefaultLiveWorker
}

// listOf joins names, at most 20, saying how many more there are.
func listOf(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	if len(names) > 20 {
		return strings.Join(names[:20], ", ") + fmt.Sprintf(" and %d more", len(names)-20)
	}
	return strings.Join(names, ", ")
}

// quiesceCurrent: the current enabled value of every worker function and
// active flag of every cron job, keyed by kind NUL name (each only when
// this role can read its table).
func quiesceCurrent(ctx context.Context, q Querier) (map[string]bool, error) {
	out := map[string]bool{}
	var fns, cron bool
	if err := q.QueryRow(ctx, `
		select coalesce(pg_catalog.bool_or(n.nspname = 'pgflow'), false), coalesce(pg_catalog.bool_or(n.nspname = 'cron'), false)
		  from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		 where ((n.nspname = 'pgflow' and c.relname = 'worker_functions') or (n.nspname = 'cron' and c.relname = 'job'))
		   and pg_catalog.has_schema_privilege(n.oid, 'USAGE') and pg_catalog.has_table_privilege(c.oid, 'SELECT')`).Scan(&fns, &cron); err != nil {
		return nil, fmt.Errorf("looking for pgflow.worker_functions and cron.job: %w", err)
	}
	read := func(kind, sql string) error {
		rows, err := q.Query(ctx, sql)
		if err != nil {
			return fmt.Errorf("reading the current %s values: %w", kind, err)
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var v bool
			if err := rows.Scan(&name, &v); err != nil {
				return fmt.Errorf("reading the current %s values: %w", kind, err)
			}
			out[kind+"\x00"+name] = v
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("reading the current %s values: %w", kind, err)
		}
		return nil
	}
	if fns {
		if err := read(quiesce.KindFunction, `select function_name, enabled from pgflow.worker_functions`); err != nil {
			return nil, err
		}
	}
	if cron {
		if err := read(quiesce.KindCronJob, `select jobid::text, active from cron.job`); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// quiesceRecorded is quiesce.recorded.
var quiesceRecorded = Check{
	ID: "quiesce.recorded", Title: "an interrupted apply --quiesce left worker functions disabled and cron jobs paused", Severity: Blocker, Runs: InAudit,
	Meaning: "apply --quiesce records every worker_functions.enabled value and pgflow cron job active flag in pgflow_upgrade.quiesce before it disables and pauses them, " +
		"and restores them at its end; a record still open means that run was killed or crashed before its restore: pgflow's workers are not started " +
		"and stalled tasks are not requeued until it is closed. The findings list the recorded values, the ones to restore.",
	Remedy: "Finish it with `" + quiesce.ResumeCommand(quiesce.ModeApply) + "` (it continues from its phase, upgrades if that is not done, and restores the recorded values), " +
		"or undo it with `" + quiesce.UndoCommand + "` (restores them without upgrading); `pgflow-upgrade status` shows its phase.",
	Run: checkQuiesceRecorded,
}

// checkQuiesceRecorded reports an open apply --quiesce record with the
// values it recorded (the ones its restore puts back) and, where this role
// can read them, the current ones.
func checkQuiesceRecorded(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	rec, unreadable, err := quiesce.Find(ctx, q)
	if err != nil {
		return nil, err
	}
	if unreadable {
		f := c.finding(0, "pgflow_upgrade.quiesce exists but this role cannot read it: whether an interrupted apply --quiesce left worker functions disabled and cron jobs paused is not known", nil)
		f.Severity = Warning
		f.Remedy = "Grant USAGE on schema pgflow_upgrade and SELECT on pgflow_upgrade.quiesce and pgflow_upgrade.quiesce_items to this role, or run `pgflow-upgrade status` as the role that runs apply."
		return []Finding{f}, nil
	}
	if rec == nil {
		return nil, nil
	}
	now, err := quiesceCurrent(ctx, q)
	if err != nil {
		return nil, err
	}
	var values []string
	var samples []map[string]any
	for _, it := range rec.Items {
		what, name := "worker function", it.Name
		flag := "enabled"
		if it.Kind == quiesce.KindCronJob {
			what, flag = "cron job", "active"
			if it.Label != "" {
				name += " " + it.Label
			}
		}
		values = append(values, fmt.Sprintf("%s %s %s %v", what, name, flag, it.Recorded))
		if len(samples) < max(env.Sample, 0) {
			cur, ok := now[it.Kind+"\x00"+it.Name]
			sample := map[string]any{"kind": it.Kind, "name": it.Name, "label": it.Label, "recorded": it.Recorded, "now": nil}
			if ok {
				sample["now"] = cur
			}
			samples = append(samples, sample)
		}
	}
	fns, jobs := rec.Counts()
	f := c.finding(int64(len(rec.Items)), fmt.Sprintf(
		"an interrupted apply --quiesce left its record open (phase %s, since %s): the %d worker function(s) and %d cron job(s) it recorded stay disabled and paused until it is closed; the values to restore (recorded before it changed them): %s",
		rec.Phase, rec.StartedAt.UTC().Format(time.RFC3339), fns, jobs, listOf(values)), samples)
	f.Remedy = "Finish it with `" + quiesce.ResumeCommand(rec.Mode) + "` (it continues from its phase, upgrades if that is not done, and restores the recorded values), " +
		"or undo it with `" + quiesce.UndoCommand + "` (restores them without upgrading)."
	return []Finding{f}, nil
}

// quiesceInventory is quiesce.inventory.
var quiesceInventory = Check{
	ID: "quiesce.inventory", Title: "what apply --quiesce would pause, deprecate and wait for", Severity: Info, Runs: InAudit,
	Needs: NeedsPgflow,
	Meaning: "apply --quiesce records and disables every pgflow.worker_functions.enabled value, pauses pgflow's pg_cron jobs with cron.alter_job, " +
		"deprecates the live 0.16.0 workers and waits until no task is 'started' by one, then applies and restores every recorded value exactly. " +
		"These findings list what it would touch; producers outside the database (start_flow callers) it cannot pause.",
	Remedy: "Nothing to fix: pause the producers yourself (docs/runbook.md, \"apply --quiesce\"), then run apply --quiesce (apply --quiesce --dry-run shows the same list).",
	Run:    checkQuiesceInventory,
}

func checkQuiesceInventory(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	if env.Schema.State != versions.SchemaBaseline {
		return nil, nil // only the 0.16.0 baseline is quiesced for the upgrade
	}
	if v := env.Schema.Version; v != nil && v.Quiesce != nil {
		// An open record (quiesce.recorded): the current values are the
		// ones it disabled, and its recorded ones are what gets restored.
		return nil, nil
	}
	inv, err := quiesce.TakeInventory(ctx, q, env.LiveWorker)
	if err != nil {
		return nil, err
	}
	var out []Finding
	add := func(n int64, msg string, samples []map[string]any) {
		f := c.finding(n, msg, samples)
		out = append(out, f)
	}
	limit := func(n int) int { return min(n, max(env.Sample, 0)) }

	var fnames []string
	var fs []map[string]any
	for i, f := range inv.Functions {
		fnames = append(fnames, fmt.Sprintf("%s (%s, enabled %v)", f.Name, f.StartMode, f.Enabled))
		if i < limit(len(inv.Functions)) {
			fs = append(fs, map[string]any{"function_name": f.Name, "start_mode": f.StartMode, "enabled": f.Enabled})
		}
	}
	add(int64(len(inv.Functions)), fmt.Sprintf("%d worker function(s) to record and disable, restored exactly after: %s", len(inv.Functions), listOf(fnames)), fs)

	switch {
	case !inv.Cron:
		add(0, "pg_cron is not installed: no cron job to pause", nil)
	case inv.CronUnreadable != "":
		add(0, "pg_cron is installed, but "+inv.CronUnreadable+": its pgflow jobs are not listed (apply's role must be able to pause them)", nil)
	default:
		var jnames []string
		var js []map[string]any
		for i, j := range inv.CronJobs {
			jnames = append(jnames, fmt.Sprintf("%d %s (%s, active %v)", j.JobID, j.Name, j.Schedule, j.Active))
			if i < limit(len(inv.CronJobs)) {
				js = append(js, map[string]any{"jobid": fmt.Sprint(j.JobID), "jobname": j.Name, "schedule": j.Schedule, "command": j.Command, "active": j.Active})
			}
		}
		msg := fmt.Sprintf("%d pgflow cron job(s) to record and pause with cron.alter_job, restored exactly after: %s", len(inv.CronJobs), listOf(jnames))
		if why := inv.Blocked(); why != "" {
			msg += "; " + why
		}
		add(int64(len(inv.CronJobs)), msg, js)
	}

	var ws []map[string]any
	for i, w := range inv.Workers {
		if i < limit(len(inv.Workers)) {
			ws = append(ws, map[string]any{"worker_id": w.ID, "function_name": w.Function, "queue": w.Queue,
				"last_heartbeat_at": w.LastHeartbeat.UTC().Format(time.RFC3339), "deprecated": w.Deprecated})
		}
	}
	add(int64(len(inv.Workers)), fmt.Sprintf("%d live 0.16.0 worker(s) to deprecate (heartbeat within %s; they stop polling at their next heartbeat)", len(inv.Workers), liveWindow(env)), ws)
	add(inv.StartedTasks, fmt.Sprintf("%d task(s) 'started' (%d by live workers: the drain waits for those, bounded by --drain-timeout)", inv.StartedTasks, inv.ByLiveWorkers), nil)
	add(0, "producers outside the database (start_flow callers, external pings of worker functions, process supervisors) cannot be paused by apply --quiesce: pause them first (docs/runbook.md)", nil)
	return out, nil
}
