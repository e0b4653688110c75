package cli_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Server settings and roles that make apply fail the same way every time:
// apply names the cause and what to do, exits 3, never says to rerun (a
// rerun fails alike), and apply --online says what remains in the database.
func TestApplyEnvironmentSettings(t *testing.T) {
	testdb.SkipIfShort(t, "Server settings and roles that make apply fail the same way every time: apply names the cause and what to...")
	t.Parallel() // long and self-contained: overlaps the package's other long tests
	type setting struct {
		name  string
		setup func(t *testing.T, db *testdb.DB, role string) // role: a superuser made for the case
		want  []string                                       // in the message: the cause and what to do
	}
	cases := []setting{
		{"role statement_timeout", func(t *testing.T, db *testdb.DB, role string) {
			db.Exec(t, "alter role "+pgx.Identifier{role}.Sanitize()+" set statement_timeout = '50ms'")
		}, []string{"statement_timeout", "50ms", "role", "options=-cstatement_timeout=0"}},
		{"database statement_timeout", func(t *testing.T, db *testdb.DB, role string) {
			db.Exec(t, "alter database "+pgx.Identifier{dbName(t, db)}.Sanitize()+" set statement_timeout = '50ms'")
		}, []string{"statement_timeout", "50ms", "database", "options=-cstatement_timeout=0"}},
		{"default_transaction_read_only", func(t *testing.T, db *testdb.DB, role string) {
			db.Exec(t, "alter role "+pgx.Identifier{role}.Sanitize()+" set default_transaction_read_only = on")
		}, []string{"default_transaction_read_only is on", "role", "default_transaction_read_only = off"}},
	}
	// Enough rows that the migration's statements take longer than 50 ms,
	// generated once: each case gets a clone of them (the subtests run one
	// after the other, so nothing is connected to state while it is cloned).
	state := testdb.Baseline(t)
	if _, err := datagen.Generate(context.Background(), state.Pool, datagen.Shape{Tasks: 60_000, Flows: 1, LiveRuns: 1, LiveTasksPerRun: 3}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		for _, mode := range [][]string{{"apply", "--yes"}, {"apply", "--online", "--yes"}} {
			t.Run(c.name+"/"+strings.Join(mode, " "), func(t *testing.T) {
				db := state.Clone(t)
				// A role of the test's own (dropped with what it made), so
				// no shared role is changed.
				role, dsnValue := superuserOn(t, db)
				c.setup(t, db, role)
				for run_ := 0; run_ < 2; run_++ {
					r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, mode...)...)
					out := r.Stdout + r.Stderr
					t.Logf("exit %d:\n%s", r.Code, out)
					if r.Code == cli.ExitOK && strings.Contains(c.name, "statement_timeout") && mode[1] == "--online" {
						// The online path bounds each of its statements itself.
						t.Log("apply --online sets statement_timeout on its own statements: it went through")
						return
					}
					if r.Code != cli.ExitEnvironment {
						t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
					}
					if strings.Contains(c.name, "statement_timeout") && mode[1] == "--online" {
						// Only its short reads and checks run under the
						// timeout: whether a rerun meets it again depends on
						// the load, as the next loop shows (it may pass).
						for _, w := range []string{"statement_timeout", "50ms", "options=-cstatement_timeout=0", "may get through or stop on this timeout again"} {
							if r.Code == cli.ExitEnvironment && !strings.Contains(out, w) {
								t.Errorf("the output does not say %q", w)
							}
						}
						if strings.Contains(out, "fails the same way") {
							t.Error("the output says a rerun fails the same way, though the online path's rerun may get through")
						}
						continue
					}
					for _, w := range c.want {
						if !strings.Contains(out, w) {
							t.Errorf("the output does not say %q", w)
						}
					}
					for _, bad := range []string{"again to continue", "then rerun", "nothing was changed"} {
						if strings.Contains(out, bad) && !strings.Contains(out, "fails the same way") {
							t.Errorf("the output says %q though a rerun fails the same way", bad)
						}
					}
				}
			})
		}
	}
}

// superuserOn creates a login superuser for db's test (dropped at cleanup,
// with what it made) and returns its name and DSN.
func superuserOn(t *testing.T, db *testdb.DB) (string, string) {
	t.Helper()
	role, dsnValue := roleOn(t, db, "")
	ident := pgx.Identifier{role}.Sanitize()
	db.Exec(t, "alter role "+ident+" superuser")
	t.Cleanup(func() {
		// What it made (an online upgrade's schema, with objects of others
		// depending on it) goes before roleOn's cleanup drops the role.
		db.Exec(t, "drop owned by "+ident+" cascade")
	})
	return role, dsnValue
}

// TestApplyOnlineEnvironmentSaysWhatRemains: an online upgrade stopped in
// its backfill, then continued by a role whose transactions are read-only:
// exit 3, the cause, and what the database holds (the phase), with no
// "run again to continue".
func TestApplyOnlineEnvironmentSaysWhatRemains(t *testing.T) {
	db := clitest.LegacyDB(t)
	stopOnlineAt(t, db, online.PointBatch)
	role, dsnValue := superuserOn(t, db)
	db.Exec(t, "alter role "+pgx.Identifier{role}.Sanitize()+" set default_transaction_read_only = on")
	r := clitest.Run(t, nil, "--dsn", dsnValue, "apply", "--online", "--yes")
	out := r.Stdout + r.Stderr
	t.Logf("exit %d:\n%s", r.Code, out)
	if r.Code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
	}
	for _, w := range []string{"default_transaction_read_only is on", "remains in the database: the online upgrade at phase backfill", "once the cause is fixed, apply --online continues"} {
		if !strings.Contains(out, w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	if strings.Contains(out, "again to continue") {
		t.Error("the output says to run again, though a rerun fails the same way")
	}
}

// TestApplyOnStandby: a hot standby made with pg_basebackup from a cluster of
// the test's own. audit reads it; apply (both modes) refuses before taking
// any lock: exit 3, "standby", point --dsn at the primary.
func TestApplyOnStandby(t *testing.T) {
	testdb.SkipIfShort(t, "a hot standby made with pg_basebackup from a cluster of the test's own")
	ctx := context.Background()
	primary, err := pgprovider.Open(ctx, pgprovider.Options{SkipDocker: true})
	if err != nil {
		t.Fatalf("a local cluster for the primary: %v", err)
	}
	t.Cleanup(func() { primary.Close() })
	if r := clitest.Run(t, nil, "--dsn", primary.DSNFor("postgres"), "fixtures", "load", "inflight"); r.Code != cli.ExitOK {
		t.Fatalf("fixtures load on the primary: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	standby, err := primary.StartStandby(ctx)
	if err != nil {
		t.Fatalf("starting a standby: %v", err)
	}
	t.Cleanup(func() { standby.Close() })
	t.Logf("standby: %s", standby.Describe())
	if r := clitest.Run(t, nil, "--dsn", standby.DSNFor("postgres"), "audit"); r.Code != cli.ExitOK {
		t.Errorf("audit on the standby: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, mode := range [][]string{{"apply", "--yes"}, {"apply", "--online", "--yes"}, {"apply", "--dry-run", "--yes"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", standby.DSNFor("postgres")}, mode...)...)
		out := r.Stdout + r.Stderr
		t.Logf("%v: exit %d: %s", mode, r.Code, strings.TrimSpace(out))
		if r.Code != cli.ExitEnvironment || !strings.Contains(out, "standby") || !strings.Contains(out, "point --dsn at the primary") {
			t.Errorf("%v on a standby: exit %d, want %d naming the standby and the primary", mode, r.Code, cli.ExitEnvironment)
		}
	}
	// The fixtures commands that write: the same error, no raw SQL error
	// (25006, read_only_sql_transaction).
	for _, cmd := range [][]string{{"fixtures", "load", "inflight"}, {"fixtures", "replay", "clean-upgrade"}} {
		r := clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_NO_DOCKER": "1"}, append([]string{"--dsn", standby.DSNFor("postgres")}, cmd...)...)
		out := r.Stdout + r.Stderr
		t.Logf("%v: exit %d: %s", cmd, r.Code, strings.TrimSpace(out))
		if r.Code != cli.ExitEnvironment || !strings.Contains(out, "this server is a standby") || !strings.Contains(out, "point --dsn at the primary") ||
			strings.Contains(out, "25006") {
			t.Errorf("%v on a standby: exit %d, want %d naming the standby and the primary, without the raw SQL error", cmd, r.Code, cli.ExitEnvironment)
		}
	}
}

// TestAuditAndStatusAgreeOnOnlineUpgrade: during an interrupted online
// upgrade, audit reports the state with its next command (a warning, exit
// 0), as status does, not a blocker that says to restore from backup.
func TestAuditAndStatusAgreeOnOnlineUpgrade(t *testing.T) {
	db := clitest.LegacyDB(t)
	stopOnlineAt(t, db, online.PointBatch)
	st := clitest.Run(t, nil, "--dsn", db.DSN, "status")
	au := clitest.Run(t, nil, "--dsn", db.DSN, "audit")
	t.Logf("status: exit %d\n%s%s\naudit: exit %d\n%s%s", st.Code, st.Stdout, st.Stderr, au.Code, au.Stdout, au.Stderr)
	if st.Code != cli.ExitOK || !strings.Contains(st.Stdout, "apply --online") {
		t.Errorf("status: exit %d, want 0 naming apply --online", st.Code)
	}
	if au.Code != cli.ExitOK || !strings.Contains(au.Stdout, "apply --online") || !strings.Contains(au.Stdout, "in progress") {
		t.Errorf("audit: exit %d, want 0 naming the online upgrade in progress and apply --online", au.Code)
	}
	if strings.Contains(au.Stdout, "restore from backup") {
		t.Error("audit tells to restore from backup during an online upgrade")
	}
}

// TestApplyWithoutAnyGrant: a role that may not even use the pgflow schema:
// apply says which privilege is missing and that it must run as the owner,
// and does not tell to rerun.
func TestApplyWithoutAnyGrant(t *testing.T) {
	db := clitest.LegacyDB(t)
	_, dsnValue := roleOn(t, db, "")
	before := testdb.State(t, db.Pool)
	for _, mode := range [][]string{{"apply", "--yes"}, {"apply", "--online", "--yes"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, mode...)...)
		out := r.Stdout + r.Stderr
		t.Logf("%v: exit %d:\n%s", mode, r.Code, out)
		if r.Code == cli.ExitOK || r.Code == cli.ExitUsage {
			t.Errorf("%v without grants: exit %d", mode, r.Code)
		}
		// Both paths check privileges before any lock (preflight.Privileges:
		// which objects, and to run as their owner); the online path used to
		// fail reading the catalog first and was diagnosed from the error,
		// which is still accepted.
		privileges := strings.Contains(out, "lacks a privilege (permission denied") && strings.Contains(out, "connect as the owner of the pgflow schema")
		privileges = privileges || (strings.Contains(out, "the current role cannot change") && strings.Contains(cellText(out), "Run apply as the role that owns the pgflow schema objects"))
		if !privileges {
			t.Errorf("%v: the output does not say which privilege is missing and what to do", mode)
		}
		if strings.Contains(out, "again to continue") {
			t.Errorf("%v: says to run again, though a rerun fails the same way", mode)
		}
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "apply without grants")
}
