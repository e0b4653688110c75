package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// runWith runs the tool in-process with stdin and the interactive flag.
func runWith(t *testing.T, interactive bool, stdin string, args ...string) clitest.Result {
	t.Helper()
	return clitest.RunApp(&cli.App{Stdin: strings.NewReader(stdin), Interactive: interactive, Getenv: func(string) string { return "" }}, args...)
}

func TestApplyCommand(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 3)

	// Not on a terminal and no --yes: a usage error, nothing done.
	r := runWith(t, false, "", "--dsn", db.DSN, "apply")
	if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, "--yes") {
		t.Fatalf("apply without --yes: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	// On a terminal, anything but "yes" declines.
	r = runWith(t, true, "no\n", "--dsn", db.DSN, "apply")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stderr, "Type yes") || !strings.Contains(r.Stderr, "not confirmed") {
		t.Fatalf("declined apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var cols int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pg_attribute where attrelid = 'pgflow.step_tasks'::regclass and attname = 'queue_name'`).Scan(&cols); err != nil || cols != 0 {
		t.Fatalf("declined apply changed the schema (%d, %v)", cols, err)
	}

	// Confirmed on a terminal: applies, with progress on stderr.
	r = runWith(t, true, "yes\n", "--dsn", db.DSN, "apply")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "applied") {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	// It reports the version now found and the next step, not the stale
	// "0.16.0 / ready: run audit, then apply" it found before.
	if !strings.Contains(r.Stdout, "pgflow version: was 0.16.0, now 0.17.0\n") ||
		!strings.Contains(r.Stdout, "next step: run `pgflow-upgrade verify`, then deploy the 0.17 workers") ||
		strings.Contains(r.Stdout, "pgflow version: pgflow 0.16.0") || strings.Contains(r.Stdout, "ready:") {
		t.Fatalf("apply's version lines:\n%s", r.Stdout)
	}
	for _, want := range []string{"table_locks", "preflight", "[1/", "commit done"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, r.Stderr)
		}
	}
	var nulls int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.step_tasks where queue_name is distinct from lower(flow_slug)`).Scan(&nulls); err != nil || nulls != 0 {
		t.Fatalf("tasks without their queue: %d (%v)", nulls, err)
	}

	// Rerun in a pipeline: a no-op that says so, exit 0, JSON.
	r = runWith(t, false, "", "--dsn", db.DSN, "--format", "json", "apply", "--yes")
	var out struct {
		Outcome  string `json:"outcome"`
		Message  string `json:"message"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("json: %v\n%s", err, r.Stdout)
	}
	if r.Code != cli.ExitOK || out.Outcome != "already_applied" || !strings.Contains(out.Message, "already upgraded") {
		t.Fatalf("rerun: exit %d %+v\n%s", r.Code, out, r.Stderr)
	}

	// status and verify agree.
	r = runWith(t, false, "", "--dsn", db.DSN, "status")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "schema state: upgraded") || !strings.Contains(r.Stdout, "pending: none") {
		t.Fatalf("status: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = runWith(t, false, "", "--dsn", db.DSN, "verify")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "0 of ") {
		t.Fatalf("verify: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

func TestApplyCommandBlockerAndDryRun(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 3)

	// Dry run: reports statements, steps and the lock window; changes nothing.
	r := runWith(t, false, "", "--dsn", db.DSN, "apply", "--yes", "--dry-run")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "dry_run") || !strings.Contains(r.Stdout, "lock window") ||
		!strings.Contains(r.Stdout, "what would change") {
		t.Fatalf("dry run: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = runWith(t, false, "", "--dsn", db.DSN, "status")
	if !strings.Contains(r.Stdout, "schema state: baseline") {
		t.Fatalf("after dry run: %s", r.Stdout)
	}

	// A blocker: refused, the findings printed, exit 1.
	if _, err := db.Pool.Exec(ctx, `insert into pgflow.flows (flow_slug) values ('Foo'), ('foo')`); err != nil {
		t.Fatal(err)
	}
	r = runWith(t, false, "", "--dsn", db.DSN, "apply", "--yes")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "blockers") || !strings.Contains(r.Stdout, "Foo") {
		t.Fatalf("apply with case aliases: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = runWith(t, false, "", "--dsn", db.DSN, "verify")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "FAIL") {
		t.Fatalf("verify on the baseline: exit %d\n%s", r.Code, r.Stdout)
	}
}

func TestApplyCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"apply", "--yes", "--lock-timeout", "0s"},
		{"apply", "--yes", "extra"},
		{"apply", "--yes", "--lock-retries", "x"},
	} {
		r := runWith(t, false, "", append([]string{"--dsn", "postgres://nobody@127.0.0.1:1/x"}, args...)...)
		if r.Code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want 2 (%s)", args, r.Code, r.Stderr)
		}
	}
	// Unreachable server: connection error.
	r := runWith(t, false, "", "--dsn", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", "status")
	if r.Code != cli.ExitEnvironment {
		t.Errorf("status on an unreachable server: exit %d (%s)", r.Code, r.Stderr)
	}
}

// Through the CLI (no named prepared statements, as through a
// transaction-mode pooler), --supabase-dir records pgflow's own 0.17.0
// migration in the Supabase ledger; without it, apply prints the command.
func TestApplyCommandRecordsSupabase(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t) // with the fixture's Supabase ledger
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, upgrade.UpstreamVersion+"_"+upgrade.UpstreamName+".sql"), []byte("-- pgflow's file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runWith(t, false, "", "--dsn", db.DSN, "apply", "--yes", "--dry-run")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, upgrade.SupabaseRepairCommand) {
		t.Fatalf("apply without --supabase-dir must print the repair command: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = runWith(t, false, "", "--dsn", db.DSN, "apply", "--yes", "--supabase-dir", dir)
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "supabase: recorded "+upgrade.UpstreamVersion) {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var name string
	if err := db.Pool.QueryRow(ctx, `select name from supabase_migrations.schema_migrations where version = $1`, upgrade.UpstreamVersion).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != upgrade.UpstreamName {
		t.Fatalf("recorded %q", name)
	}
}

// TestApplyProgressOffTerminal: a pipeline's log shows apply's steps as they
// happen (stderr), not only the report at the end.
func TestApplyProgressOffTerminal(t *testing.T) {
	db := testdb.Inflight(t, 3)
	r := runWith(t, false, "", "apply", "--dsn", db.DSN, "--yes")
	if r.Code != cli.ExitOK {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{"- ", "done in", "    ["} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("no progress %q on stderr off a terminal:\n%s", want, r.Stderr)
		}
	}
}
