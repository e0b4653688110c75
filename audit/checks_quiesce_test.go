package audit_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// quiesce.inventory lists, as info, what apply --quiesce would touch.
func TestQuiesceInventory(t *testing.T) {
	db := inflight(t) // two live 0.16.0 workers holding started tasks
	db.Exec(t,
		`insert into pgflow.worker_functions (function_name, enabled, start_mode) values ('fn-http', true, 'http'), ('fn-proc', false, 'process')`,
		`select cron.alter_job(job_id => (select jobid from cron.job where jobname = 'pgflow_cleanup_logs'), active => false)`,
		`select cron.schedule('not_pgflow', '* * * * *', 'select 1')`)
	rep := only(t, db, audit.Options{Sample: 5}, "quiesce.inventory")
	fs := fired(t, rep, "quiesce.inventory", audit.Info)
	if len(fs) != 5 || rep.Blockers() != 0 {
		t.Fatalf("%d info findings, want 5 (functions, cron jobs, workers, started tasks, producers): %+v", len(fs), fs)
	}
	byPrefix := func(p string) audit.Finding {
		for _, f := range fs {
			if strings.Contains(f.Message, p) {
				return f
			}
		}
		t.Fatalf("no finding about %q: %+v", p, fs)
		return audit.Finding{}
	}
	if f := byPrefix("worker function"); f.Count != 2 || !strings.Contains(f.Message, "fn-proc (process, enabled false)") || !sampleHas(f, "function_name", "fn-http") {
		t.Fatalf("functions: %+v", f)
	}
	if f := byPrefix("cron job"); f.Count != 3 || !strings.Contains(f.Message, "pgflow_cleanup_logs (0 * * * *, active false)") || strings.Contains(f.Message, "not_pgflow") {
		t.Fatalf("cron jobs: %+v", f)
	}
	if f := byPrefix("live 0.16.0 worker"); f.Count < 1 || len(f.Samples) == 0 || f.Samples[0]["last_heartbeat_at"] == nil {
		t.Fatalf("workers: %+v", f)
	}
	if f := byPrefix("'started'"); f.Count < 1 {
		t.Fatalf("started tasks: %+v", f)
	}
	byPrefix("producers outside the database")

	// Without pg_cron: said so.
	db.DropCron(t)
	rep = only(t, db, audit.Options{}, "quiesce.inventory")
	found := false
	for _, f := range fired(t, rep, "quiesce.inventory", audit.Info) {
		found = found || strings.Contains(f.Message, "pg_cron is not installed")
	}
	if !found {
		t.Fatalf("no pg_cron finding: %+v", rep.Checks)
	}
}
