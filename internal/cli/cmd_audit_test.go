package cli_test

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/mattn/go-runewidth"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// auditDB is a baseline with one flow and one started run.
func auditDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	for _, s := range []string{
		`select pgflow.create_flow('f')`,
		`select pgflow.add_step('f', 'a')`,
		`select pgflow.start_flow('f', '{}'::jsonb)`,
	} {
		if _, err := db.Pool.Exec(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// auditDoc is the part of the JSON document the tests read.
type auditDoc struct {
	Target        string `json:"target"`
	ServerVersion string `json:"server_version"`
	PGMQ          struct {
		Installed bool   `json:"installed"`
		Kind      string `json:"kind"`
	} `json:"pgmq"`
	Schema struct {
		State string `json:"state"`
	} `json:"schema"`
	Summary struct {
		Blockers     int `json:"blockers"`
		Inconclusive int `json:"inconclusive"`
		ExitCode     int `json:"exit_code"`
	} `json:"summary"`
	Checks []struct {
		ID       string `json:"id"`
		Status   string `json:"status"`
		Findings []struct {
			Severity string           `json:"severity"`
			Count    int64            `json:"count"`
			AtLeast  bool             `json:"at_least"`
			Samples  []map[string]any `json:"samples"`
		} `json:"findings"`
		DurationMS *int64 `json:"duration_ms"`
	} `json:"checks"`
}

func TestAuditCleanDatabaseExitsZero(t *testing.T) {
	db := auditDB(t)
	r := clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}, "audit")
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	lines := strings.Split(strings.TrimRight(r.Stdout, "\n"), "\n")
	// The one warning is the real pgmq's: pg_dump leaves out the queue
	// tables an extension owns. The stand-in's are ordinary tables.
	verdict, wants := "GO: 0 blockers, 0 warnings, 0 cannot tell (exit 0)", []string{"schema state baseline", "pgmq.installed"}
	if testdb.PGMQKindInUse() == fixtures.PGMQExtension {
		verdict = "GO: 0 blockers, 1 warning, 0 cannot tell (exit 0)"
		wants = append(wants, "WARNING backup.pgdump_pgmq", "  remedy: ")
	}
	if !strings.HasPrefix(lines[0], verdict) {
		t.Errorf("the first line is not the verdict %q: %q", verdict, lines[0])
	}
	// A clean audit of a small real 0.16.0 database: about 30 lines of at
	// most 100 columns.
	if len(lines) > 30 {
		t.Errorf("a clean audit prints %d lines:\n%s", len(lines), r.Stdout)
	}
	for _, l := range lines {
		if runewidth.StringWidth(l) > 100 {
			t.Errorf("a line of %d columns: %q", runewidth.StringWidth(l), l)
		}
	}
	for _, want := range wants {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("table output lacks %q:\n%s", want, r.Stdout)
		}
	}
	// The details are under --verbose: the tables of findings and of checks.
	for _, not := range []string{"SEVERITY", "DURATION", "│ sessions.long_transactions", "run `pgflow-upgrade audit`"} {
		if strings.Contains(r.Stdout, not) {
			t.Errorf("the short output has %q:\n%s", not, r.Stdout)
		}
	}
	v := clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}, "audit", "--verbose")
	if v.Code != cli.ExitOK || !strings.HasPrefix(v.Stdout, lines[0][:len("GO: ")]) {
		t.Fatalf("--verbose: exit %d\n%s", v.Code, v.Stdout)
	}
	for _, want := range []string{"SEVERITY", "│ sessions.long_transactions", "(samples)", "forecast: pgflow.step_tasks about", "exit 0"} {
		if !strings.Contains(v.Stdout, want) {
			t.Errorf("--verbose lacks %q:\n%s", want, v.Stdout)
		}
	}
}

func TestAuditBlockersExitOneWithJSON(t *testing.T) {
	db := auditDB(t)
	// A step slug 0.17.0 refuses.
	if _, err := db.Pool.Exec(context.Background(), `select pgflow.add_step('f', 'b__c')`); err != nil {
		t.Fatal(err)
	}
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "audit", "--sample", "1")
	if r.Code != cli.ExitFindings {
		t.Fatalf("exit %d, want %d\n%s%s", r.Code, cli.ExitFindings, r.Stdout, r.Stderr)
	}
	var doc auditDoc
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, r.Stdout)
	}
	if doc.Summary.Blockers != 1 || doc.Summary.ExitCode != 1 || doc.Schema.State != "baseline" || !doc.PGMQ.Installed || doc.ServerVersion == "" {
		t.Fatalf("document: %+v", doc)
	}
	found := false
	for _, c := range doc.Checks {
		if c.DurationMS == nil {
			t.Errorf("%s has no duration_ms", c.ID)
		}
		if c.ID != "slugs.strict_rule" {
			continue
		}
		found = true
		if c.Status != "findings" || len(c.Findings) != 1 || c.Findings[0].Severity != "blocker" || len(c.Findings[0].Samples) != 1 ||
			c.Findings[0].Count != 1 || c.Findings[0].AtLeast {
			t.Fatalf("slug check: %+v", c)
		}
		if c.Findings[0].Samples[0]["step_slug"] != "b__c" {
			t.Fatalf("sample: %#v", c.Findings[0].Samples[0])
		}
	}
	if !found {
		t.Fatal("no slugs.strict_rule in the JSON")
	}
	// Table form: the verdict, then the blocker in full with its remedy and
	// samples, then one line per informational finding.
	r = clitest.Run(t, nil, "--dsn", db.DSN, "audit", "--check", "slugs.strict_rule", "--check", "schema.state")
	if r.Code != cli.ExitFindings || !strings.HasPrefix(r.Stdout, "NO-GO: 1 blocker, 0 warnings, 0 cannot tell (exit 1)\n") ||
		!strings.Contains(cellText(r.Stdout), "pgflow.delete_flow_and_data") || !strings.Contains(r.Stdout, "  e.g. ") || !strings.Contains(r.Stdout, "step_slug=b__c") {
		t.Fatalf("exit %d\n%s", r.Code, r.Stdout)
	}
	if b, i := strings.Index(r.Stdout, "BLOCKER slugs.strict_rule"), strings.Index(r.Stdout, "  schema.state: "); b < 0 || i < 0 || b > i {
		t.Fatalf("blockers are not listed before info:\n%s", r.Stdout)
	}
	if strings.Contains(r.Stdout, "run `pgflow-upgrade audit`") {
		t.Fatalf("the audit tells the user to run the audit:\n%s", r.Stdout)
	}
	r = clitest.Run(t, nil, "--dsn", db.DSN, "audit", "--verbose", "--check", "slugs.strict_rule", "--check", "schema.state")
	if b, i := strings.Index(r.Stdout, "│ blocker"), strings.Index(r.Stdout, "│ info"); b < 0 || i < 0 || b > i || !strings.Contains(r.Stdout, "(samples)") {
		t.Fatalf("--verbose: blockers are not listed before info:\n%s", r.Stdout)
	}
}

func TestAuditUnknownCheckIsAUsageError(t *testing.T) {
	r := clitest.Run(t, nil, "--dsn", "postgres://nobody@127.0.0.1:1/x", "audit", "--check", "no.such.check")
	if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, "tasks.duplicate_message_id") {
		t.Fatalf("exit %d, stderr %q: want %d listing the known ids", r.Code, r.Stderr, cli.ExitUsage)
	}
	if r := clitest.Run(t, nil, "audit"); r.Code != cli.ExitUsage {
		t.Fatalf("no DSN: exit %d", r.Code)
	}
}

func TestAuditInconclusiveUnderLockExitsFour(t *testing.T) {
	db := auditDB(t)
	db.HoldLock(t, `lock table pgflow.step_tasks in access exclusive mode`)
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "audit", "--lock-timeout", "200ms")
	if r.Code != cli.ExitInconclusive {
		t.Fatalf("exit %d, want %d\n%s%s", r.Code, cli.ExitInconclusive, r.Stdout, r.Stderr)
	}
	var doc auditDoc
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatal(err)
	}
	statuses := map[string]string{}
	for _, c := range doc.Checks {
		statuses[c.ID] = c.Status
	}
	if statuses["tasks.duplicate_message_id"] != "inconclusive" || statuses["flows.case_alias"] != "ok" || doc.Summary.Inconclusive == 0 {
		t.Fatalf("statuses %v", statuses)
	}
}

func TestAuditNeverPrintsThePassword(t *testing.T) {
	db := auditDB(t)
	const password = "Cli-pw-93b2d4-secret"
	role, good := db.PasswordRole(t, "h_audit_cli", password,
		`grant usage on schema pgflow, pgmq to %[1]s`,
		`grant select on all tables in schema pgflow, pgmq to %[1]s`)
	u, err := url.Parse(good)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_database_h_audit"
	bad := u.String()

	for _, args := range [][]string{
		{"--dsn", good, "audit"},
		{"--dsn", good, "--format", "json", "audit"},
		{"--dsn", good, "audit", "--check", "pgmq.installed", "--check", "sessions.long_transactions"},
		{"--dsn", bad, "audit"},
	} {
		r := clitest.Run(t, nil, args...)
		if strings.Contains(r.Stdout+r.Stderr, password) {
			t.Fatalf("%v printed the password:\n%s%s", args[2:], r.Stdout, r.Stderr)
		}
		if args[1] == bad {
			if r.Code != cli.ExitEnvironment {
				t.Fatalf("bad database: exit %d, want %d: %s", r.Code, cli.ExitEnvironment, r.Stderr)
			}
		} else if r.Code != cli.ExitOK {
			t.Fatalf("%v as a read-only role: exit %d\n%s%s", args[2:], r.Code, r.Stdout, r.Stderr)
		}
	}
	// Through the environment too.
	r := clitest.Run(t, map[string]string{"DATABASE_URL": good}, "--format", "json", "audit")
	if r.Code != cli.ExitOK || strings.Contains(r.Stdout+r.Stderr, password) || !strings.Contains(r.Stdout, role) {
		t.Fatalf("DATABASE_URL: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
