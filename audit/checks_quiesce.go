package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
)

// The quiesce inventory is registered here rather than in checks.go so the
// feature stays in one place: this init runs after checks.go's (the go
// command hands a package's files to the compiler sorted by name), and it
// appends to the catalog checks.go built.
func init() {
	catalog = append(catalog, Check{
		ID: "quiesce.inventory", Title: "what apply --quiesce would pause, deprecate and wait for", Severity: Info,
		Needs: NeedsPgflow,
		Meaning: "apply --quiesce records and disables every pgflow.worker_functions.enabled value, pauses pgflow's pg_cron jobs with cron.alter_job, " +
			"deprecates the live 0.16.0 workers and waits until no task is 'started' by one, then applies and restores every recorded value exactly. " +
			"These findings list what it would touch; producers outside the database (start_flow callers) it cannot pause.",
		Remedy: "Nothing to fix: pause the producers yourself (docs/runbook.md, \"apply --quiesce\"), then run apply --quiesce (apply --quiesce --dry-run shows the same list).",
		Run:    checkQuiesceInventory,
	})
}

func checkQuiesceInventory(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("quiesce.inventory")
	if env.Schema.State != StateBaseline {
		return nil, nil // only the 0.16.0 baseline is quiesced for the upgrade
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
