package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb/versiontest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// auditFinding is one finding of audit --format json.
type auditFinding struct {
	CheckID  string `json:"check"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
	Remedy   string `json:"remedy"`
}

// auditFindings runs audit --format json and returns its exit code, its
// findings and its output.
func auditFindings(t *testing.T, db *testdb.DB) (int, []auditFinding, string) {
	t.Helper()
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "audit")
	var out struct {
		Checks []struct {
			Findings []auditFinding `json:"findings"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("audit json (%v): exit %d\n%s%s", err, r.Code, r.Stdout, r.Stderr)
	}
	var all []auditFinding
	for _, c := range out.Checks {
		all = append(all, c.Findings...)
	}
	return r.Code, all, r.Stdout
}

// flat is out with every run of white space one space: a phrase is found
// wherever the human output wrapped it.
func flat(out string) string { return strings.Join(strings.Fields(out), " ") }

// quiesceRecordOpen says whether pgflow_upgrade.quiesce holds a record.
func quiesceRecordOpen(t *testing.T, db *testdb.DB) bool {
	t.Helper()
	ctx := context.Background()
	var exists bool
	if err := db.Pool.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.quiesce') is not null`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		return false
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `select pg_catalog.count(*)::int from pgflow_upgrade.quiesce`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A killed apply --quiesce (recorded, paused, deprecated, drained, then
// gone before its restore) is a state every command sees: audit blocks on
// it with the recorded values and both commands, status's next step is one
// of them, and apply without them refuses, changing nothing.
func TestCrashedQuiesceIsAStateEveryCommandSees(t *testing.T) {
	testdb.SkipIfShort(t, "audit, status, apply and verify all name a crashed apply --quiesce")
	db := quiesceDB(t)
	before := recordedValues(t, db)
	crashQuiesceAt(t, db, quiesce.PointDrained)
	paused := recordedValues(t, db)
	if paused == before || !strings.Contains(paused, "a-fn=false") || !strings.Contains(paused, "pgflow_requeue_stalled_tasks=false") {
		t.Fatalf("the crash left %s (before: %s)", paused, before)
	}
	const resume, undo = "pgflow-upgrade apply --resume-quiesce --yes", "pgflow-upgrade apply --undo-quiesce --yes"

	// audit: a blocker with the recorded values (a-fn was enabled, the
	// requeue job active) and both commands; the inventory does not offer
	// the disabled values as the ones to restore.
	code, findings, out := auditFindings(t, db)
	if code != cli.ExitFindings {
		t.Fatalf("audit: exit %d, want %d\n%s", code, cli.ExitFindings, out)
	}
	var rec int
	for _, f := range findings {
		switch f.CheckID {
		case "quiesce.recorded":
			rec++
			if f.Severity != "blocker" || !strings.Contains(f.Message, "phase drained") ||
				!strings.Contains(f.Message, "worker function a-fn enabled true") || !strings.Contains(f.Message, "worker function b-fn enabled false") ||
				!strings.Contains(f.Message, "pgflow_requeue_stalled_tasks active true") || !strings.Contains(f.Message, "pgflow_cleanup_logs active false") ||
				!strings.Contains(f.Remedy, resume) || !strings.Contains(f.Remedy, undo) {
				t.Errorf("quiesce.recorded: %+v", f)
			}
		case "quiesce.inventory":
			t.Errorf("the inventory lists the disabled values while a record is open: %+v", f)
		}
	}
	if rec != 1 {
		t.Fatalf("audit: %d quiesce.recorded findings, want 1\n%s", rec, out)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "audit"); r.Code != cli.ExitFindings || !strings.Contains(flat(r.Stdout), "quiesce.recorded") ||
		!strings.Contains(flat(r.Stdout), resume) || !strings.Contains(flat(r.Stdout), undo) {
		t.Fatalf("audit table: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	// status: the next step is one of the two commands.
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "status")
	v := versionOf(t, r)
	if r.Code != cli.ExitFindings || !strings.Contains(v.PgflowVersion.NextStep, resume) || !strings.Contains(v.PgflowVersion.NextStep, undo) {
		t.Fatalf("status: exit %d, next step %q\n%s", r.Code, v.PgflowVersion.NextStep, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); !strings.Contains(flat(r.Stdout), "next step: an interrupted `pgflow-upgrade apply --quiesce` left its record open (phase drained") {
		t.Fatalf("status table:\n%s", r.Stdout)
	}

	// apply without --resume-quiesce / --undo-quiesce refuses (exit 1),
	// naming both; nothing changes (plain, dry run, online).
	for _, args := range [][]string{{"apply", "--yes"}, {"apply", "--dry-run", "--yes"}, {"apply", "--quiesce", "--dry-run", "--yes"}, {"apply", "--online", "--yes"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", db.DSN}, args...)...)
		if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout+r.Stderr, resume) || !strings.Contains(r.Stdout+r.Stderr, undo) {
			t.Fatalf("%v: exit %d, want %d\n%s%s", args, r.Code, cli.ExitFindings, r.Stdout, r.Stderr)
		}
		if got := recordedValues(t, db); got != paused {
			t.Fatalf("%v changed %s into %s", args, paused, got)
		}
		if !quiesceRecordOpen(t, db) {
			t.Fatalf("%v closed the record", args)
		}
		if r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "status"); versionOf(t, r).PgflowVersion.Found != "0.16.0" {
			t.Fatalf("%v changed the schema: %s", args, r.Stdout)
		}
	}

	// Undone: the recorded values are back, and audit and status are clean of it.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--undo-quiesce", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("undo: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("undo gave %s, want %s", got, before)
	}
	if code, findings, out := auditFindings(t, db); code != cli.ExitOK {
		t.Fatalf("audit after undo: exit %d\n%s", code, out)
	} else {
		for _, f := range findings {
			if f.CheckID == "quiesce.recorded" {
				t.Fatalf("audit after undo: %+v", f)
			}
		}
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "status"); r.Code != cli.ExitOK || strings.Contains(versionOf(t, r).PgflowVersion.NextStep, "quiesce") {
		t.Fatalf("status after undo: exit %d\n%s", r.Code, r.Stdout)
	}
}

// An online upgrade stopped half way is named as such by audit and by
// apply's refusal (not as an unknown schema to restore), with its two
// commands.
func TestOnlineInProgressNamedByAuditAndApply(t *testing.T) {
	db := testdb.Baseline(t)
	db.Exec(t, `select pgflow.create_flow('Half_Way')`, `select pgflow.add_step('Half_Way', 'only')`, `select pgflow.start_flow('Half_Way', '{}')`)
	stopOnlineAt(t, db, online.PointIndex)
	const cont, undo = "`pgflow-upgrade apply --online`", "`pgflow-upgrade apply --rollback-online`"

	code, findings, out := auditFindings(t, db)
	if strings.Contains(out, "not a pgflow version this tool knows") || strings.Contains(out, "restore those objects") {
		t.Fatalf("audit calls the online upgrade an unknown schema:\n%s", out)
	}
	var state int
	for _, f := range findings {
		if f.CheckID == "schema.state" {
			state++
			if f.Severity != "warning" || !strings.HasPrefix(f.Message, "an online upgrade (apply --online) is in progress (phase contract)") ||
				!strings.Contains(f.Remedy, cont) || !strings.Contains(f.Remedy, undo) {
				t.Errorf("schema.state: %+v", f)
			}
		}
	}
	if state != 1 || code != cli.ExitOK {
		t.Fatalf("audit: exit %d, %d schema.state findings\n%s", code, state, out)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "audit"); !strings.Contains(flat(r.Stdout), "pgflow version: online upgrade of ours in progress (phase contract)") ||
		strings.Contains(r.Stdout, "restore those objects") {
		t.Fatalf("audit table: exit %d\n%s", r.Code, r.Stdout)
	}

	for _, args := range [][]string{{"apply", "--yes"}, {"apply", "--dry-run", "--yes"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", db.DSN}, args...)...)
		// The refusal, as stderr's last line and stdout's second, starts with what the database is.
		lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
		refusal := lines[len(lines)-1]
		msg := strings.SplitN(r.Stdout, "\n", 3)
		if r.Code != cli.ExitFindings || !strings.HasPrefix(refusal, "pgflow-upgrade apply: an online upgrade (pgflow-upgrade apply --online) is in progress on this database (phase contract)") ||
			len(msg) < 2 || !strings.HasPrefix(msg[1], "an online upgrade (pgflow-upgrade apply --online) is in progress") ||
			!strings.Contains(refusal, cont) || !strings.Contains(refusal, undo) || strings.Contains(r.Stdout+r.Stderr, "restore those objects") {
			t.Fatalf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	// The refusal changed nothing: the online upgrade finishes from there.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--online", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("apply --online after the refusals: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// apply --quiesce looks at the state before it touches anything: on a
// database that is not pgflow 0.16.0 it gives apply's own answer (a
// refusal naming the version and the next step, or "already upgraded"),
// with no SQL error and nothing paused or recorded.
func TestApplyQuiesceChecksTheStateFirst(t *testing.T) {
	testdb.SkipIfShort(t, "apply --quiesce on every state that is not 0.16.0 refuses before recording anything")
	cases := []struct {
		name string
		db   func(t *testing.T) *testdb.DB
		code int
		want string
	}{
		{"no pgflow", func(t *testing.T) *testdb.DB { return testdb.PGMQ(t) }, cli.ExitFindings, "no pgflow schema"},
		{"0.14.x without upstream's files", func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup(versions.V0_14)) }, cli.ExitFindings, "needs upstream's files 21-27"},
		{"0.17.0", func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup(versions.V0_17_0)) }, cli.ExitOK, "already upgraded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := c.db(t)
			for _, args := range [][]string{{"apply", "--quiesce", "--yes"}, {"apply", "--quiesce", "--dry-run", "--yes"}} {
				r := clitest.Run(t, nil, append([]string{"--dsn", db.DSN}, args...)...)
				all := r.Stdout + r.Stderr
				if r.Code != c.code || !strings.Contains(all, c.want) || strings.Contains(all, "SQLSTATE") {
					t.Fatalf("%v: exit %d, want %d and %q\n%s%s", args, r.Code, c.code, c.want, r.Stdout, r.Stderr)
				}
				if c.code != cli.ExitOK && !strings.Contains(all, "--quiesce paused nothing") {
					t.Fatalf("%v: the refusal does not say nothing was paused\n%s", args, all)
				}
				if quiesceRecordOpen(t, db) {
					t.Fatalf("%v left a quiesce record", args)
				}
			}
		})
	}
}

// An apply --quiesce killed after its upgrade committed, before its
// restore, leaves an upgraded schema with the functions disabled and the
// jobs paused: verify fails on it, naming both commands, and a plain apply
// refuses instead of calling it "already upgraded".
func TestVerifyFailsWhileAQuiesceRecordIsOpen(t *testing.T) {
	db := quiesceDB(t)
	before := recordedValues(t, db)
	crashQuiesceAt(t, db, quiesce.PointApplied)
	const resume, undo = "pgflow-upgrade apply --resume-quiesce --yes", "pgflow-upgrade apply --undo-quiesce --yes"

	type verifyJSON struct {
		Checks []struct {
			ID     string `json:"id"`
			OK     bool   `json:"ok"`
			Detail string `json:"detail"`
		} `json:"checks"`
	}
	closed := func(r clitest.Result) (found, ok bool, detail string) {
		t.Helper()
		var v verifyJSON
		if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
			t.Fatalf("verify json (%v): %s%s", err, r.Stdout, r.Stderr)
		}
		for _, c := range v.Checks {
			if c.ID == "quiesce_closed" {
				return true, c.OK, c.Detail
			}
		}
		return false, false, ""
	}
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "verify")
	if found, ok, detail := closed(r); r.Code != cli.ExitFindings || !found || ok || !strings.Contains(detail, "phase applied") ||
		!strings.Contains(detail, resume) || !strings.Contains(detail, undo) {
		t.Fatalf("verify with the record open: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitFindings || !strings.Contains(r.Stdout+r.Stderr, resume) ||
		strings.Contains(r.Stdout, "already upgraded: pgflow") {
		t.Fatalf("plain apply with the record open: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--resume-quiesce", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("resume: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("resume gave %s, want %s", got, before)
	}
	r = clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "verify")
	if found, ok, _ := closed(r); r.Code != cli.ExitOK || !found || !ok {
		t.Fatalf("verify after the resume: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// crashQuiesceAt runs apply --quiesce on db and kills it (no restore runs)
// when it reaches point, leaving its record open.
func crashQuiesceAt(t *testing.T, db *testdb.DB, point string) {
	t.Helper()
	ctx := context.Background()
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(ctx)
	crash := errors.New("killed by the test")
	q := &quiesce.Options{Mode: quiesce.ModeApply, DrainTimeout: 10 * time.Second, Hooks: quiesce.Hooks{Crash: true,
		At: func(_ context.Context, p string) error {
			if p == point {
				return crash
			}
			return nil
		}}}
	if _, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q}); !errors.Is(err, crash) {
		t.Fatalf("apply --quiesce did not stop at %s: %v", point, err)
	}
}
