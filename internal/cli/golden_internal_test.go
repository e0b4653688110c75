package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mattn/go-runewidth"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/queueroutes"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The golden tests pin the human output of audit, status and verify
// (testdata/golden/*.txt) for fixed reports: the verdict on the first line,
// what fails in full, one line per informational finding, nothing wider
// than 100 columns. `go test ./internal/cli -run TestGolden -update`
// rewrites the files after a deliberate change; review the diff.
var updateGolden = flag.Bool("update", false, "rewrite testdata/golden")

const goldenTarget = "postgres@db.example:5432/app"

var goldenAt = time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)

func golden(t *testing.T, name, got string) {
	t.Helper()
	for i, l := range strings.Split(got, "\n") {
		if w := runewidth.StringWidth(l); w > lineWidth {
			t.Errorf("%s line %d is %d columns wide: %q", name, i+1, w, l)
		}
	}
	path := filepath.Join("testdata", "golden", name+".txt")
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (-update rewrites it):\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

func ready() *versions.Detection {
	return &versions.Detection{Found: "0.16.0", State: versions.StateReady, Exact: true,
		NextStep: "ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`"}
}

// cleanReport is the audit of a small real 0.16.0 database with nothing
// wrong: the checks and findings a clean audit has.
func cleanReport() *audit.Report {
	ok := func(id string) audit.CheckResult {
		return audit.CheckResult{ID: id, Title: id, Status: audit.StatusOK, Findings: []audit.Finding{}, DurationMS: 2}
	}
	info := func(id, msg string, samples ...map[string]any) audit.Finding {
		return audit.Finding{CheckID: id, Severity: audit.Info, Message: msg, Remedy: "None.", Samples: samples}
	}
	rep := &audit.Report{ServerVersion: "15.18 (Debian 15.18-0+deb12u1)", Database: "app",
		PGMQ: pgmqver.Found{Installed: true, Kind: "extension", Version: "1.5.1"}, Schema: versions.SchemaInfo{State: versions.SchemaBaseline},
		PgflowVersion: ready(), DurationMS: 228, Started: goldenAt}
	rep.Checks = append(rep.Checks,
		audit.CheckResult{ID: "schema.state", Status: audit.StatusFindings, Findings: []audit.Finding{
			info("schema.state", "schema state baseline: pgflow 0.16.0. Next: ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`")}},
		audit.CheckResult{ID: "pgmq.installed", Status: audit.StatusFindings, Findings: []audit.Finding{
			info("pgmq.installed", "pgmq: extension 1.5.1", map[string]any{"kind": "extension", "version": "1.5.1"})}})
	for _, id := range []string{"flows.case_alias", "steps.case_alias", "slugs.strict_rule", "flows.queue_name_too_long", "tasks.duplicate_message_id",
		"pgmq.unowned_queue", "pgmq.queue_case_spellings", "workers.legacy_alive", "pgmq.flow_queue_missing", "pgmq.queue_physical",
		"sessions.long_transactions", "sessions.locks_on_pgflow"} {
		rep.Checks = append(rep.Checks, ok(id))
	}
	rep.Checks = append(rep.Checks,
		audit.CheckResult{ID: "size.tables", Status: audit.StatusFindings, Findings: []audit.Finding{
			info("size.tables", "8 pgflow tables, 448.0 KiB in total", map[string]any{"table": "pgflow.step_tasks", "size": "128.0 KiB"}),
			info("size.tables", "2 pgmq queue tables, 72.0 KiB in total, 0 messages (counted: the tables were never analysed)"),
			info("size.tables", "backfill: pgflow.step_tasks (row count unknown: never analyzed, 128.0 KiB with indexes) is rewritten under ACCESS EXCLUSIVE"),
		}},
		audit.CheckResult{ID: "backup.pgdump_pgmq", Status: audit.StatusFindings, Findings: []audit.Finding{{
			CheckID: "backup.pgdump_pgmq", Severity: audit.Warning, Count: 1,
			Message: "pgmq is an extension: pg_dump leaves out pgmq.meta and the tables and messages of all 1 queue(s)",
			Remedy: "Before apply take a physical backup or provider snapshot (pg_basebackup, PITR), or export the queue tables next to pg_dump " +
				"(\\copy (select * from pgmq.q_<queue>) to ...), and check that a restore brings the messages back.",
			Samples: []map[string]any{{"queue": "f"}}}}},
		audit.CheckResult{ID: "quiesce.inventory", Status: audit.StatusFindings, Findings: []audit.Finding{
			info("quiesce.inventory", "0 worker function(s) to record and disable, restored exactly after: none"),
			info("quiesce.inventory", "3 pgflow cron job(s) to record and pause with cron.alter_job, restored exactly after: 1 pgflow_ensure_workers (1 second, active true), "+
				"2 pgflow_cleanup_logs (0 * * * *, active true), 3 pgflow_requeue_stalled_tasks (15 seconds, active true)",
				map[string]any{"jobid": 1, "jobname": "pgflow_ensure_workers", "schedule": "1 second", "active": true}),
			info("quiesce.inventory", "0 live 0.16.0 worker(s) to deprecate (heartbeat within 1m0s; they stop polling at their next heartbeat)"),
		}})
	return rep
}

func unavailable() *forecast.Forecast {
	return forecast.Unavailable(&forecast.Stats{StepTasks: 0}, time.Minute,
		"no per-row costs to forecast with: pass --calibration FILE or measure them with --calibrate-dsn DSN or --calibrate-local")
}

func TestGoldenAudit(t *testing.T) {
	rep := cleanReport()
	var b bytes.Buffer
	if err := writeAuditTable(&b, goldenTarget, rep, unavailable(), auditExitCode(rep), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "audit_clean", b.String())
	// The person on call reads the verdict, then about 30 lines at most.
	if n := strings.Count(b.String(), "\n"); n > 30 {
		t.Errorf("a clean audit prints %d lines", n)
	}
	if strings.Contains(b.String(), "`pgflow-upgrade audit`") {
		t.Error("the audit tells the user to run the audit")
	}

	// --verbose keeps everything: the findings' table, every sample, the
	// per-check timing table, the forecast's reason in full.
	b.Reset()
	if err := writeAuditTable(&b, goldenTarget, rep, unavailable(), auditExitCode(rep), true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SEVERITY", "JOBNAME", "│ sessions.locks_on_pgflow", "--calibrate-local", "exit 0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("--verbose lacks %q", want)
		}
	}

	// A blocker and a check out of time: NO-GO, both in full.
	rep.Checks[4] = audit.CheckResult{ID: "slugs.strict_rule", Status: audit.StatusFindings, Findings: []audit.Finding{{
		CheckID: "slugs.strict_rule", Severity: audit.Blocker, Count: 1,
		Message: "1 slug(s) break 0.17.0's slug rule (0 flow slug(s), 1 step slug(s)): re-adding slug_is_valid and steps_step_slug_check fails",
		Remedy:  "Slugs cannot be renamed in place: let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<flow>')), rename it in the worker code.",
		Samples: []map[string]any{{"flow_slug": "f", "kind": "step", "step_slug": "b__c"}}}}}
	rep.Checks[6] = audit.CheckResult{ID: "tasks.duplicate_message_id", Title: "tasks sharing a message id", Status: audit.StatusInconclusive, Findings: []audit.Finding{},
		Error: "canceling statement due to statement timeout (SQLSTATE 57014)", Coverage: &audit.Coverage{Table: "pgflow.step_tasks", Examined: 500000, Estimated: 2000000}}
	b.Reset()
	if err := writeAuditTable(&b, goldenTarget, rep, unavailable(), auditExitCode(rep), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "audit_blocker", b.String())

	rep.Checks[4] = audit.CheckResult{ID: "slugs.strict_rule", Status: audit.StatusOK, Findings: []audit.Finding{}}
	b.Reset()
	if err := writeAuditTable(&b, goldenTarget, rep, unavailable(), auditExitCode(rep), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "audit_cannot_tell", b.String())
}

// routesReport: a step-mode flow whose resize step has no worker while a
// message waits, and a flow-mode flow served by two workers.
func routesReport() *queueroutes.Report {
	since := goldenAt.Add(-3*time.Minute - 12*time.Second)
	oldest := goldenAt.Add(-40 * time.Second)
	rep := &queueroutes.Report{ReadAt: goldenAt, HeartbeatIntervalMS: 5000, LiveWindowMS: 30000, GraceMS: 20000, Routes: []queueroutes.Route{
		{Flow: "greet", QueueMode: queueroutes.ModeFlow, Queue: "greet", QueueExists: true, Visible: 0, Hidden: 2, OldestEnqueuedAt: &oldest, State: queueroutes.StateOK,
			Workers: []queueroutes.Worker{{FunctionName: "greet-worker", PgflowVersion: "0.17.1"}, {FunctionName: "greet-worker", PgflowVersion: "0.17.1"}}},
		{Flow: "img", QueueMode: queueroutes.ModeStep, Step: "fetch", Queue: "img__fetch", QueueExists: true, State: queueroutes.StateOK,
			Workers: []queueroutes.Worker{{FunctionName: "img-fetch"}}},
		{Flow: "img", QueueMode: queueroutes.ModeStep, Step: "resize", Queue: "img__resize", QueueExists: true, Visible: 3, OldestEnqueuedAt: &since,
			Waiting: 3, WaitingSince: &since, State: queueroutes.StateNoWorker, Workers: []queueroutes.Worker{}},
	}}
	rep.Findings = []queueroutes.Finding{{Flow: "img", Step: "resize", Queue: "img__resize", State: queueroutes.StateNoWorker, Waiting: 3, Since: &since,
		Message: "flow img, step resize, queue img__resize: 3 message(s) waiting since " + since.Format(time.RFC3339) + " and no live worker",
		Deploy: "deploy a pgflow 0.17 worker for step resize of flow img (step mode: polling queue img__resize; package worker: Config.StepSlug \"resize\"; " +
			"TypeScript: withStepQueues(flow) with stepSlug \"resize\")"}}
	return rep
}

func upgradedStatus() *upgrade.StatusReport {
	d := &versions.Detection{Found: "0.17.0", State: versions.StateUpgraded, Exact: true,
		NextStep: "already upgraded (pgflow 0.17.0, by this tool or by pgflow's own migration): nothing to do"}
	return &upgrade.StatusReport{State: versions.SchemaInfo{State: versions.SchemaUpgraded}, PgflowVersion: d, Pending: []string{},
		Applied:    []upgrade.Revision{{Version: "20261203100000", Name: "pgflow_private_step_queues", AppliedAt: goldenAt}},
		Migrations: []upgrade.MigrationStatus{{Version: "20261203100000", Name: "pgflow_private_step_queues", Applied: true, Status: "applied 2026-12-04 09:00:00Z"}},
		AtlasSum:   upgrade.SumStatus{Valid: true},
		PGMQ:       pgmqver.Found{Installed: true, Kind: "extension", Version: "1.5.1", Layout: "members", Newest: "1.13.1"}}
}

func TestGoldenStatus(t *testing.T) {
	var b bytes.Buffer
	if err := writeStatus(&b, goldenTarget, upgradedStatus(), nil, nil, &routesResult{Report: routesReport()}, false); err != nil {
		t.Fatal(err)
	}
	golden(t, "status_routes", b.String())
	// The first paragraph (wrapped at 100 columns) is the version and the next step.
	if head, _, _ := strings.Cut(b.String(), "\nstatus of "); !strings.HasPrefix(head, "pgflow version: pgflow 0.17.0; next step: ") ||
		!strings.Contains(head, "`pgflow-upgrade verify --routes`") {
		t.Errorf("the output does not open with the version and the next step: %q", head)
	}

	st := upgradedStatus()
	st.PgflowVersion = ready()
	st.State.State = versions.SchemaBaseline
	st.Applied, st.Pending = nil, []string{"20261203100000_pgflow_private_step_queues"}
	st.Migrations[0].Applied, st.Migrations[0].Status = false, "pending"
	b.Reset()
	if err := writeStatus(&b, goldenTarget, st, nil, nil, nil, false); err != nil {
		t.Fatal(err)
	}
	golden(t, "status_ready", b.String())
}

func TestGoldenVerify(t *testing.T) {
	vr := &upgrade.VerifyReport{OK: true, Checks: []upgrade.CheckOutcome{
		{ID: "catalog_0_17_0", Title: "schema pgflow is upstream's 0.17.0", OK: true},
		{ID: "old_start_tasks_gone", Title: "0.16.0 start_tasks gone", OK: true},
	}}
	var b bytes.Buffer
	rr := &routesResult{Report: routesReport()}
	if err := writeVerify(&b, goldenTarget, vr, nil, rr, verifyExitCode(vr, rr), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "verify_routes_fail", b.String())

	rr.Routes, rr.Findings = rr.Routes[:2], nil
	b.Reset()
	if err := writeVerify(&b, goldenTarget, vr, nil, rr, verifyExitCode(vr, rr), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "verify_routes_pass", b.String())

	rr = &routesResult{Error: "reading the routes: ERROR: permission denied for table flows (SQLSTATE 42501)"}
	b.Reset()
	if err := writeVerify(&b, goldenTarget, vr, nil, rr, verifyExitCode(vr, rr), false); err != nil {
		t.Fatal(err)
	}
	golden(t, "verify_routes_cannot_tell", b.String())
}

// TestVerifyExitCodes: a failed check or route 1 before an unknown route 4.
func TestVerifyExitCodes(t *testing.T) {
	ok, bad := &upgrade.VerifyReport{OK: true}, &upgrade.VerifyReport{OK: false}
	failing := &routesResult{Report: &queueroutes.Report{Findings: []queueroutes.Finding{{}}, Unknown: 1}}
	unknown := &routesResult{Report: &queueroutes.Report{Unknown: 1}}
	for _, c := range []struct {
		vr   *upgrade.VerifyReport
		rr   *routesResult
		want int
	}{
		{ok, nil, ExitOK}, {bad, nil, ExitFindings}, {ok, &routesResult{Report: &queueroutes.Report{}}, ExitOK},
		{ok, failing, ExitFindings}, {ok, unknown, ExitInconclusive}, {bad, unknown, ExitFindings},
		{ok, &routesResult{Error: "timeout"}, ExitInconclusive},
	} {
		if got := verifyExitCode(c.vr, c.rr); got != c.want {
			t.Errorf("verifyExitCode(%+v, %+v) = %d, want %d", c.vr, c.rr, got, c.want)
		}
	}
}

func TestWithoutSelf(t *testing.T) {
	for _, c := range []struct{ step, cmd, want string }{
		{"ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`", "audit", "ready: run `pgflow-upgrade apply`"},
		{"ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`", "status", "ready: run `pgflow-upgrade audit`, then `pgflow-upgrade apply`"},
		{"upgrade to 0.16.0 first, then run `pgflow-upgrade audit`", "audit", "upgrade to 0.16.0 first"},
		{"see `pgflow-upgrade audit` for details", "audit", "see this audit for details"},
	} {
		if got := withoutSelf(c.step, c.cmd); got != c.want {
			t.Errorf("withoutSelf(%q, %q) = %q, want %q", c.step, c.cmd, got, c.want)
		}
	}
}
