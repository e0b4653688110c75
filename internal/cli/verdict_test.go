package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// stopOnlineAt runs apply --online on db and stops it at point, as a
// crash between its transactions would.
func stopOnlineAt(t *testing.T, db *testdb.DB, point string) {
	t.Helper()
	ctx := context.Background()
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(ctx)
	stop := errors.New("stopped by the test")
	_, err := online.Upgrade(ctx, conn, online.Options{BatchSize: 1, Hooks: online.Hooks{At: func(_ context.Context, _ uint32, p string) error {
		if p == point {
			return stop
		}
		return nil
	}}})
	if !errors.Is(err, stop) {
		t.Fatalf("apply --online did not stop at %s: %v", point, err)
	}
}

// nextStepOf is the next step the first lines of out name.
func nextStepOf(out string) string {
	_, after, ok := strings.Cut(flat(out), "next step: ")
	if !ok {
		return ""
	}
	for _, end := range []string{" audit of ", " status of ", " verify of ", " schema state: "} {
		if i := strings.Index(after, end); i >= 0 {
			after = after[:i]
		}
	}
	return after
}

// TestVerdictAgreesWithNextStep walks every state audit, status and verify
// can meet through the three commands: the first line (the verdict) and the
// next step agree. A bare GO from audit means the plain apply it names goes
// through (its dry run exits 0); where plain apply refuses, audit's first
// line says what the database is instead, and status and audit name the
// same next step. Before, audit said `GO: 0 blockers` on a half-done online
// upgrade, which plain apply refuses.
func TestVerdictAgreesWithNextStep(t *testing.T) {
	testdb.SkipIfShort(t, "every state through audit, status, verify and apply --dry-run")
	states := []struct {
		name string
		db   func(t *testing.T) *testdb.DB
	}{
		{"baseline", func(t *testing.T) *testdb.DB { return testdb.Baseline(t) }},
		{"online stopped in its backfill (a crash there)", func(t *testing.T) *testdb.DB {
			db := testdb.Baseline(t)
			db.Exec(t, `select pgflow.create_flow('half_way')`, `select pgflow.add_step('half_way', 'only')`, `select pgflow.start_flow('half_way', '{}')`, `select pgflow.start_flow('half_way', '{}')`)
			stopOnlineAt(t, db, online.PointBatch)
			return db
		}},
		{"online stopped before its index builds", func(t *testing.T) *testdb.DB {
			db := testdb.Baseline(t)
			stopOnlineAt(t, db, online.PointIndex)
			return db
		}},
		{"open quiesce", func(t *testing.T) *testdb.DB {
			db := quiesceDB(t)
			crashQuiesceAt(t, db, quiesce.PointDrained)
			return db
		}},
		{"partial release (between 0.17.0 and 0.17.1)", func(t *testing.T) *testdb.DB {
			n := len(testdb.UpstreamReleaseFiles(t, "0.17.0")) + 1
			if n >= len(testdb.UpstreamReleaseFiles(t, "0.17.1")) {
				t.Fatal("0.17.1 is one file after 0.17.0: pick another partial state")
			}
			return testdb.UpstreamPrefix(t, n)
		}},
		{"newer than known", func(t *testing.T) *testdb.DB {
			db := testdb.Baseline(t)
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
				t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			db.Exec(t, `insert into pgflow_upgrade.schema_revisions (version, name) values ('29991231000000', 'from_the_future')`)
			return db
		}},
		{"upgraded", func(t *testing.T) *testdb.DB {
			db := testdb.Baseline(t)
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
				t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			return db
		}},
	}
	for _, s := range states {
		t.Run(s.name, func(t *testing.T) {
			db := s.db(t)
			audit := clitest.Run(t, nil, "--dsn", db.DSN, "audit")
			status := clitest.Run(t, nil, "--dsn", db.DSN, "status")
			verify := clitest.Run(t, nil, "--dsn", db.DSN, "verify")
			dry := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--dry-run", "--yes")
			first := func(r clitest.Result) string { l, _, _ := strings.Cut(r.Stdout, "\n"); return l }
			t.Logf("audit (exit %d): %s\n  next: %s", audit.Code, first(audit), nextStepOf(audit.Stdout))
			t.Logf("status (exit %d): next: %s", status.Code, nextStepOf(status.Stdout))
			t.Logf("verify (exit %d): %s", verify.Code, first(verify))
			dryLines := strings.Split(strings.TrimSpace(dry.Stderr), "\n")
			t.Logf("apply --dry-run: exit %d: %s", dry.Code, dryLines[len(dryLines)-1])

			bareGO := strings.HasPrefix(first(audit), "GO:")
			var doc struct {
				Summary struct {
					Verdict string `json:"verdict"`
				} `json:"summary"`
			}
			js := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "audit")
			if err := json.Unmarshal([]byte(js.Stdout), &doc); err != nil || !strings.HasPrefix(first(audit), doc.Summary.Verdict+":") {
				t.Errorf("audit's JSON verdict %q (%v) is not its first line's: %s", doc.Summary.Verdict, err, first(audit))
			}
			if bareGO && dry.Code != cli.ExitOK {
				t.Errorf("audit says GO, but apply --dry-run exits %d:\n%s\n%s", dry.Code, audit.Stdout, dry.Stderr)
			}
			an, sn := nextStepOf(audit.Stdout), nextStepOf(status.Stdout)
			if bareGO && !strings.Contains(an, "`pgflow-upgrade apply`") {
				t.Errorf("audit says GO but its next step is not to apply: %s", an)
			}
			if !bareGO && strings.HasSuffix(an, "run `pgflow-upgrade apply`") {
				t.Errorf("audit's next step is the plain apply but its verdict is %q", first(audit))
			}
			// Both read the same detection: the same next step (status's
			// may start with the audit, which audit leaves out).
			if statusSaid := strings.ReplaceAll(sn, "run `pgflow-upgrade audit`, then ", "run "); !bareGO && !strings.HasPrefix(an, "resolve the") && an != statusSaid {
				t.Errorf("audit and status name different next steps:\n  audit:  %s\n  status: %s", an, sn)
			}
			verdict := first(verify)
			// A FAIL says what the database is and what to do: status's
			// next step (before, verify printed its failed checks alone).
			if vn := nextStepOf(verify.Stdout); strings.HasPrefix(verdict, "FAIL") && !strings.Contains(sn, "pgflow-upgrade verify") && vn != sn {
				t.Errorf("verify fails without status's next step:\n  verify: %s\n  status: %s", vn, sn)
			}
			upgrades := dry.Code == cli.ExitOK && strings.Contains(dry.Stdout, "dry run: the migration ran")
			if strings.HasPrefix(verdict, "PASS") && upgrades {
				t.Errorf("verify passes, but apply would upgrade:\n%s", dry.Stdout)
			}
			if !strings.HasPrefix(verdict, "PASS") && dry.Code == cli.ExitOK && strings.Contains(dry.Stdout, "already upgraded") {
				t.Errorf("verify does not pass (%s) but apply says already upgraded", verdict)
			}
			if (dry.Code != cli.ExitOK) != (status.Code != cli.ExitOK) && !strings.Contains(sn, "apply --online") {
				t.Errorf("apply --dry-run exits %d but status %d (status's next step: %s)", dry.Code, status.Code, sn)
			}
		})
	}
}
