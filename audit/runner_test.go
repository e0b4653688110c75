package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// probe is an extra check that runs sql in the audit's transaction and
// reports the single text value it returns.
func probe(id, sql string) audit.Check {
	return audit.Check{ID: id, Title: id, Severity: audit.Info,
		Run: func(ctx context.Context, _ audit.Check, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			var v string
			if err := q.QueryRow(ctx, sql).Scan(&v); err != nil {
				return nil, err
			}
			return []audit.Finding{{CheckID: id, Severity: audit.Info, Message: v}}, nil
		}}
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

func TestReadOnlyIsEnforcedByTheServer(t *testing.T) {
	db := oneFlow(t)
	conn := testdb.Connect(t, db.DSN)
	rep, err := audit.Run(context.Background(), conn, audit.Options{
		Checks: []string{"schema.state"},
		Extra: []audit.Check{
			probe("test.insert", `insert into pgflow.flows (flow_slug) values ('sneaky') returning flow_slug`),
			probe("test.pgmq_send", `select pgmq.send('f', '{"sneaky": true}'::jsonb)::text`),
			probe("test.settings", `select concat_ws(' ', current_setting('transaction_read_only'), current_setting('statement_timeout'),
			        current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout'), current_setting('application_name'))`),
		},
		CheckTimeout: 4 * time.Second, LockTimeout: 700 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"test.insert", "test.pgmq_send"} {
		r := result(t, rep, id)
		if r.Status != audit.StatusError || sqlstate(r.Err) != "25006" {
			t.Fatalf("%s: status %s, error %v: want read_only_sql_transaction (25006)", id, r.Status, r.Err)
		}
	}
	r := result(t, rep, "test.settings")
	if len(r.Findings) != 1 || r.Findings[0].Message != "on 4s 700ms 30s pgflow-upgrade audit" {
		t.Fatalf("settings inside the audit's transaction: %+v %s", r.Findings, r.Error)
	}
	// SET LOCAL: nothing stays on the session afterwards.
	var st, app string
	if err := conn.QueryRow(context.Background(), `select current_setting('statement_timeout'), current_setting('application_name')`).Scan(&st, &app); err != nil {
		t.Fatal(err)
	}
	if st != "0" || app == "pgflow-upgrade audit" {
		t.Fatalf("session settings leaked: statement_timeout %q, application_name %q", st, app)
	}
	var n int
	if err := db.Pool.QueryRow(context.Background(), `select (select count(*) from pgflow.flows where flow_slug = 'sneaky') + (select count(*) from pgmq.q_f where message ? 'sneaky')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the writes left %d rows (%v)", n, err)
	}
}

// lockStepTasks holds ACCESS EXCLUSIVE on pgflow.step_tasks from another
// session until the test ends.
func lockStepTasks(t *testing.T, dsn string) {
	t.Helper()
	other := testdb.Connect(t, dsn)
	ctx := context.Background()
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `lock table pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
}

// The checks that read pgflow.step_tasks (or its size).
var stepTasksChecks = []string{"tasks.duplicate_message_id", "size.tables", "quiesce.inventory"}

func TestLockedStepTasksMakeOnlyTheirChecksInconclusive(t *testing.T) {
	db := oneFlow(t)
	lockStepTasks(t, db.DSN)
	lockTimeout := 200 * time.Millisecond
	start := time.Now()
	rep := runAudit(t, db, audit.Options{LockTimeout: lockTimeout, CheckTimeout: 5 * time.Second})
	elapsed := time.Since(start)

	affected := map[string]bool{}
	for _, id := range stepTasksChecks {
		affected[id] = true
		r := result(t, rep, id)
		if r.Status != audit.StatusInconclusive || sqlstate(r.Err) != "55P03" {
			t.Errorf("%s: status %s (%v), want inconclusive with lock_not_available", id, r.Status, r.Err)
		}
	}
	for _, r := range rep.Checks {
		if !affected[r.ID] && (r.Status == audit.StatusInconclusive || r.Status == audit.StatusError) {
			t.Errorf("%s: status %s (%s): only the step_tasks checks should be affected", r.ID, r.Status, r.Error)
		}
	}
	// The other checks still report, and see the lock.
	f := mustFire(t, rep, "sessions.locks_on_pgflow", audit.Warning)
	if !sampleHas(f, "mode", "AccessExclusiveLock") || !sampleHas(f, "table", "pgflow.step_tasks") {
		t.Fatalf("locks finding: %+v", f)
	}
	// Generous upper bound: lock timeout plus a margin per affected check.
	if limit := time.Duration(len(stepTasksChecks))*(lockTimeout+2*time.Second) + 5*time.Second; elapsed > limit {
		t.Fatalf("audit took %s under the lock, more than %s", elapsed, limit)
	}
	if rep.Blockers() != 0 || rep.Inconclusive() != len(stepTasksChecks) {
		t.Fatalf("blockers %d, inconclusive %d", rep.Blockers(), rep.Inconclusive())
	}
	// The duplicate scan says it decided nothing, and of how much.
	d := result(t, rep, "tasks.duplicate_message_id")
	if d.Coverage == nil || d.Coverage.Examined != 0 || d.Coverage.Table != "pgflow.step_tasks" ||
		!strings.Contains(d.Error, "inconclusive: examined 0 ") {
		t.Fatalf("duplicate scan under the lock: %+v %q", d.Coverage, d.Error)
	}
}

func TestBudgets(t *testing.T) {
	db := oneFlow(t)
	// A check that outlives its budget is inconclusive; the next one runs.
	rep := runAudit(t, db, audit.Options{Checks: []string{"flows.case_alias"}, CheckTimeout: 300 * time.Millisecond,
		Extra: []audit.Check{probe("test.slow", `select pg_sleep(30)::text`), probe("test.after", `select 'ran'`)}})
	if r := result(t, rep, "test.slow"); r.Status != audit.StatusInconclusive || sqlstate(r.Err) != "57014" {
		t.Fatalf("slow check: %s %v", r.Status, r.Err)
	}
	if r := result(t, rep, "test.after"); r.Status != audit.StatusFindings || r.Findings[0].Message != "ran" {
		t.Fatalf("check after the slow one: %+v", r)
	}
	mustBeOK(t, rep, "flows.case_alias")
	// The total budget: once it is used up, the remaining checks are not run.
	// (The slow check sleeps in Go, past the whole budget, so the order is certain.)
	sleeper := audit.Check{ID: "test.sleeps", Title: "sleeps", Severity: audit.Info,
		Run: func(ctx context.Context, _ audit.Check, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			time.Sleep(600 * time.Millisecond)
			return nil, nil
		}}
	rep = runAudit(t, db, audit.Options{TotalTimeout: 500 * time.Millisecond, CheckTimeout: 5 * time.Second,
		Checks: []string{"schema.state"}, Extra: []audit.Check{sleeper, probe("test.after", `select 'ran'`)}})
	if r := result(t, rep, "test.after"); r.Status != audit.StatusInconclusive || !strings.Contains(r.Error, "total budget") {
		t.Fatalf("after the total budget: %+v", r)
	}
}

func TestRoleWithOnlyUsageAndSelect(t *testing.T) {
	db := oneFlow(t)
	ctx := context.Background()
	_, readOnly := db.PasswordRole(t, "h_audit_ro", "Ro-pw-7c1f9e-secret",
		`grant usage on schema pgflow, pgmq to %[1]s`,
		`grant select on all tables in schema pgflow, pgmq to %[1]s`)
	// Another role's session, so there is something the read-only role cannot see.
	otherSession := testdb.Connect(t, db.DSN)
	if _, err := otherSession.Exec(ctx, `select 1`); err != nil {
		t.Fatal(err)
	}

	rep, err := audit.Run(ctx, testdb.Connect(t, readOnly), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Checks {
		if r.Status == audit.StatusError || r.Status == audit.StatusInconclusive || r.Status == audit.StatusSkipped {
			t.Errorf("%s as a read-only role: %s %s", r.ID, r.Status, r.Error)
		}
	}
	if rep.Schema.State != versions.SchemaBaseline {
		t.Fatalf("state %s as a read-only role", rep.Schema.State)
	}
	hidden := false
	for _, f := range result(t, rep, "sessions.long_transactions").Findings {
		hidden = hidden || (f.Severity == audit.Info && strings.Contains(f.Message, "not visible"))
	}
	if !hidden {
		t.Fatalf("no note about sessions hidden from a role without pg_read_all_stats: %+v", result(t, rep, "sessions.long_transactions"))
	}
}

func TestPreflightIsExactAndKeepsTheCallersTransaction(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.add_step('f', 'x')`, `select pgflow.add_step('f', 'X')`,
		`update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks)`, `analyze pgflow.step_tasks`)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `set local statement_timeout = '42s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `lock table pgflow.flows, pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	settings := `select concat_ws(' ', current_setting('work_mem'), current_setting('enable_hashagg'), current_setting('enable_seqscan'))`
	var before string
	if err := tx.QueryRow(ctx, settings).Scan(&before); err != nil {
		t.Fatal(err)
	}
	results, err := audit.RunPreflight(ctx, tx, audit.Options{Bound: 1, Extra: []audit.Check{
		probe("test.fails", `select (1/0)::text`),
		probe("test.after", `select 'ran'`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]audit.CheckResult{}
	for _, r := range results {
		byID[r.ID] = r
	}
	// What ran is what is declared for apply's preflight of every plan:
	// no audit-only check, no hop's own check.
	for _, c := range audit.Checks() {
		want := c.Runs.Has(audit.UnderLocks) && c.Hop == audit.EveryPlan
		if _, ran := byID[c.ID]; ran != want {
			t.Errorf("%s: ran %v, declared runs %b, hop %d", c.ID, ran, c.Runs, c.Hop)
		}
	}
	// Exact, the chunk size (Bound) changes nothing.
	if d := byID["tasks.duplicate_message_id"]; len(d.Findings) != 1 || d.Findings[0].Count != 1 || !strings.Contains(d.Findings[0].Message, "(2 tasks)") {
		t.Fatalf("preflight duplicates: %+v", d)
	}
	if s := byID["steps.case_alias"]; len(s.Findings) != 1 || s.Findings[0].Count != 1 {
		t.Fatalf("preflight step aliases: %+v", s)
	}
	if audit.Blockers(results) != 2 {
		t.Fatalf("blockers %d, want 2: %+v", audit.Blockers(results), results)
	}
	if r := byID["test.fails"]; r.Status != audit.StatusError || sqlstate(r.Err) != "22012" {
		t.Fatalf("failing check: %+v", r)
	}
	if r := byID["test.after"]; r.Status != audit.StatusFindings {
		t.Fatalf("check after a failing one: %+v", r)
	}
	// The caller's transaction is alive, with its own settings and locks.
	var st, after string
	if err := tx.QueryRow(ctx, `select current_setting('statement_timeout')`).Scan(&st); err != nil || st != "42s" {
		t.Fatalf("caller's statement_timeout after preflight: %q (%v)", st, err)
	}
	// The duplicate scan's planner settings (work_mem 64MB, enable_hashagg
	// and, with Bound 1, enable_seqscan off) went with its savepoint.
	if err := tx.QueryRow(ctx, settings).Scan(&after); err != nil || after != before || strings.Contains(after, "64MB") {
		t.Fatalf("settings after preflight: %q, before %q (%v)", after, before, err)
	}
	var locks int
	if err := tx.QueryRow(ctx, `select count(*) from pg_locks where pid = pg_backend_pid() and mode = 'AccessExclusiveLock'
	        and relation in ('pgflow.flows'::regclass, 'pgflow.step_tasks'::regclass)`).Scan(&locks); err != nil || locks != 2 {
		t.Fatalf("caller's locks after preflight: %d (%v)", locks, err)
	}
}

func TestUnknownCheckID(t *testing.T) {
	_, err := audit.Lookup("no.such")
	if err == nil || !strings.Contains(err.Error(), "tasks.duplicate_message_id") {
		t.Fatalf("Lookup error should list the known ids: %v", err)
	}
	db := testdb.Baseline(t)
	if _, err := audit.Run(context.Background(), testdb.Connect(t, db.DSN), audit.Options{Checks: []string{"no.such"}}); err == nil {
		t.Fatal("Run accepted an unknown check id")
	}
}

func TestRoleWithoutGrantsGetsErrorsNotBlockers(t *testing.T) {
	db := oneFlow(t)
	ctx := context.Background()
	_, noGrants := db.LoginRole(t, "h_audit_none", "")
	rep, err := audit.Run(ctx, testdb.Connect(t, noGrants), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blockers() != 0 {
		t.Fatalf("blockers invented from what the role could not read: %+v", rep.Checks)
	}
	r := result(t, rep, "tasks.duplicate_message_id")
	if r.Status != audit.StatusError || sqlstate(r.Err) != "42501" || !strings.Contains(r.Error, "grant usage on schema pgflow, pgmq") {
		t.Fatalf("duplicate check without grants: %s %q", r.Status, r.Error)
	}
	// Catalog-only checks still answer.
	mustFire(t, rep, "schema.state", audit.Info)
	mustFire(t, rep, "pgmq.installed", audit.Info)
}
