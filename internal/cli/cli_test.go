package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func TestVersionPrintsMigrationsHash(t *testing.T) {
	r := clitest.Run(t, nil, "version")
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	if !strings.Contains(r.Stdout, migrations.Hash()) || len(migrations.Hash()) < 40 {
		t.Fatalf("version output lacks the atlas.sum hash %q:\n%s", migrations.Hash(), r.Stdout)
	}
	r = clitest.Run(t, nil, "--format", "json", "version")
	var v map[string]string
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil || v["migrations_hash"] != migrations.Hash() {
		t.Fatalf("json version: %v %q", err, r.Stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{
		{"--format", "yaml", "version"},
		{"--no-such-flag", "version"},
		{"fixtures", "load"},
		{"fixtures", "load", "no-such-state"},
	}
	for _, args := range cases {
		r := clitest.Run(t, nil, args...)
		if r.Code != cli.ExitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, r.Code, cli.ExitUsage, r.Stderr)
		}
		if r.Stderr == "" {
			t.Errorf("%v: no explanation on stderr", args)
		}
	}
}

func TestFixturesListAndLoad(t *testing.T) {
	r := clitest.Run(t, nil, "fixtures", "list")
	if r.Code != 0 || !strings.Contains(r.Stdout, "baseline") {
		t.Fatalf("fixtures list: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	db := testdb.Empty(t)
	r = clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}, "fixtures", "load", "baseline")
	if r.Code != 0 {
		t.Fatalf("fixtures load baseline: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), "select count(*) from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace where n.nspname = 'pgflow' and p.proname = 'start_tasks'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("baseline not loaded: start_tasks count %d (%v)", n, err)
	}
	// A second load refuses: the database is not empty any more.
	r = clitest.Run(t, nil, "--dsn", db.DSN, "fixtures", "load", "baseline")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stderr, "already has a pgflow schema") {
		t.Fatalf("second load: exit %d, stderr %q", r.Code, r.Stderr)
	}
}

func TestConnectionErrorsNeverPrintThePassword(t *testing.T) {
	r := clitest.Run(t, nil, "--dsn", "postgres://alice:hunter2secret@127.0.0.1:1/db?connect_timeout=2", "fixtures", "load", "baseline")
	if r.Code != cli.ExitEnvironment {
		t.Fatalf("exit %d, want %d: %s", r.Code, cli.ExitEnvironment, r.Stderr)
	}
	if strings.Contains(r.Stdout+r.Stderr, "hunter2secret") {
		t.Fatalf("password printed: %s %s", r.Stdout, r.Stderr)
	}
	r = clitest.Run(t, nil, "--dsn", "postgres://alice:hunter2secret@127.0.0.1:notaport/db", "fixtures", "load", "baseline")
	if r.Code != cli.ExitUsage || strings.Contains(r.Stdout+r.Stderr, "hunter2secret") {
		t.Fatalf("malformed DSN: exit %d, output %q", r.Code, r.Stderr)
	}
}

// TestMalformedDSNNeverEchoed: a connection string that does not parse, in
// the flag or the environment, is not quoted in any part, and the message
// stays readable (no one-letter "password" masked all over it).
func TestMalformedDSNNeverEchoed(t *testing.T) {
	for _, bad := range []string{
		"postgres://alice:p@ss:w0rd-Secret@db.example:5432/app", // '@' and ':' typed raw
		"postgres://alice:50%off-Secret@db.example/app",         // '%' typed raw
		"postgres://alice:a b c Secret@db.example/app",          // spaces
		"postgres://a:e@db.example:notaport/Secret",
		"host=db.example password='unterminated-Secret",
	} {
		for name, r := range map[string]clitest.Result{
			"--dsn":              clitest.Run(t, nil, "audit", "--dsn", bad),
			"PGFLOW_UPGRADE_DSN": clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_DSN": bad}, "status"),
			"DATABASE_URL":       clitest.Run(t, map[string]string{"DATABASE_URL": bad}, "fixtures", "load", "baseline"),
		} {
			out := r.Stdout + r.Stderr
			if r.Code != cli.ExitUsage {
				t.Errorf("%s %q: exit %d\n%s", name, bad, r.Code, out)
			}
			if strings.Contains(out, "Secret") || strings.Contains(out, "db.example") || strings.Contains(out, "xxxxx") {
				t.Errorf("%s %q: the string (or a masked piece of it) is in the message:\n%s", name, bad, out)
			}
			for _, want := range []string{"malformed connection string", "percent-encode", "PGPASSWORD", "--help"} {
				if !strings.Contains(out, want) {
					t.Errorf("%s %q: no %q in:\n%s", name, bad, want, out)
				}
			}
		}
	}
}
