package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb/versiontest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// versionJSON is the stable pgflow_version object of status, audit and apply.
type versionJSON struct {
	PgflowVersion struct {
		Found       string `json:"found"`
		State       string `json:"state"`
		Closest     string `json:"closest"`
		NextStep    string `json:"next_step"`
		Differences []struct {
			Kind    string `json:"kind"`
			Change  string `json:"change"`
			Message string `json:"message"`
		} `json:"differences"`
		Online *struct {
			Phase    string `json:"phase"`
			Continue string `json:"continue"`
		} `json:"online"`
	} `json:"pgflow_version"`
}

func versionOf(t *testing.T, r clitest.Result) versionJSON {
	t.Helper()
	var v versionJSON
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatalf("not JSON (%v): %s%s", err, r.Stdout, r.Stderr)
	}
	return v
}

// status, audit and apply name the version they find, with the next step.
func TestCommandsNameThePgflowVersion(t *testing.T) {
	testdb.SkipIfShort(t, "status, audit and apply name the version they find, with the next step")
	cases := []struct {
		name      string
		db        func(t *testing.T) *testdb.DB
		found     string
		state     string
		next      string
		statusRC  int
		auditRC   int
		applyRC   int
		applyText string
	}{
		{name: "0.14.x", db: func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup("0.14.x")) },
			found: "0.14.x", state: "older", next: "run `pgflow-upgrade audit`, then `pgflow-upgrade apply --pgflow-migrations DIR`",
			statusRC: cli.ExitOK, auditRC: cli.ExitOK, applyRC: cli.ExitFindings, applyText: "upstream's files"},
		{name: "0.15.1", db: func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup("0.15.1")) },
			found: "0.15.1", state: "older", next: "run `pgflow-upgrade audit`, then `pgflow-upgrade apply --pgflow-migrations DIR`",
			statusRC: cli.ExitOK, auditRC: cli.ExitOK, applyRC: cli.ExitFindings, applyText: "upstream's files"},
		{name: "real 0.16.0 baseline", db: func(t *testing.T) *testdb.DB { return testdb.Baseline(t) },
			found: "0.16.0", state: "ready", next: "run `pgflow-upgrade audit`, then `pgflow-upgrade apply`",
			statusRC: cli.ExitOK, auditRC: cli.ExitOK, applyRC: -1},
		{name: "0.17.0", db: func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup("0.17.0")) },
			found: "0.17.0", state: "upgraded", next: "pgflow 0.17.0; upstream's newest release is 0.17.1-endpoint-fix",
			statusRC: cli.ExitOK, auditRC: cli.ExitOK, applyRC: cli.ExitOK, applyText: "already upgraded"},
		{name: "0.17.1+", db: func(t *testing.T) *testdb.DB { return versiontest.DB(t, versions.MustLookup("0.17.1+")) },
			found: "0.17.1+", state: "upgraded", next: "upstream's newest release is 0.17.1-endpoint-fix",
			statusRC: cli.ExitOK, auditRC: cli.ExitOK, applyRC: cli.ExitOK, applyText: "already upgraded"},
		{name: "unknown", db: func(t *testing.T) *testdb.DB {
			db := versiontest.DB(t, versions.MustLookup("0.16.0"))
			db.Exec(t, `drop function pgflow.start_tasks(text, bigint[], uuid)`)
			return db
		}, found: "", state: "unknown", next: "closest is 0.16.0",
			statusRC: cli.ExitFindings, auditRC: cli.ExitFindings, applyRC: cli.ExitFindings,
			applyText: "function pgflow.start_tasks(text, bigint[], uuid): missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := c.db(t)
			env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}

			r := clitest.Run(t, env, "status")
			if r.Code != c.statusRC || !strings.Contains(r.Stdout, "next step: ") || !strings.Contains(cellText(r.Stdout), c.next) ||
				(c.found != "" && !strings.Contains(r.Stdout, "pgflow version: pgflow "+c.found)) {
				t.Fatalf("status: exit %d (want %d)\n%s%s", r.Code, c.statusRC, r.Stdout, r.Stderr)
			}
			if c.state == "upgraded" { // upgraded by upstream's own migrations: our revision is not needed, not pending
				if want := "not needed (pgflow " + c.found + " found, applied by"; !strings.Contains(r.Stdout, want) ||
					strings.Contains(r.Stdout, " pending") || !strings.Contains(r.Stdout, "pending: none") {
					t.Fatalf("status of an upstream-upgraded database: want %q, no pending row\n%s", want, r.Stdout)
				}
			}
			r = clitest.Run(t, env, "--format", "json", "status")
			v := versionOf(t, r)
			if c.state == "upgraded" {
				var mig struct {
					Migrations []struct {
						Applied bool   `json:"applied"`
						Status  string `json:"status"`
					} `json:"migrations"`
					Pending []string `json:"pending"`
				}
				if err := json.Unmarshal([]byte(r.Stdout), &mig); err != nil || len(mig.Migrations) == 0 || len(mig.Pending) != 0 ||
					mig.Migrations[0].Applied || !strings.HasPrefix(mig.Migrations[0].Status, "not needed (pgflow "+c.found+" found") {
					t.Fatalf("status json migrations (%v): %+v", err, mig)
				}
			}
			if v.PgflowVersion.Found != c.found || v.PgflowVersion.State != c.state || !strings.Contains(v.PgflowVersion.NextStep, c.next) {
				t.Fatalf("status json: %+v", v.PgflowVersion)
			}
			if c.state == "unknown" && (len(v.PgflowVersion.Differences) != 1 || v.PgflowVersion.Differences[0].Change != "missing" ||
				v.PgflowVersion.Differences[0].Message != "function pgflow.start_tasks(text, bigint[], uuid): missing") {
				t.Fatalf("status json differences: %+v", v.PgflowVersion.Differences)
			}

			// The audit's next step is the same, less the audit itself.
			r = clitest.Run(t, env, "audit", "--check", "schema.state")
			next := strings.ReplaceAll(c.next, "run `pgflow-upgrade audit`, then ", "run ")
			if r.Code != c.auditRC || !strings.Contains(cellText(r.Stdout), next) || strings.Contains(r.Stdout, "`pgflow-upgrade audit`") {
				t.Fatalf("audit: exit %d (want %d)\n%s%s", r.Code, c.auditRC, r.Stdout, r.Stderr)
			}
			r = clitest.Run(t, env, "--format", "json", "audit", "--check", "schema.state")
			if v := versionOf(t, r); v.PgflowVersion.Found != c.found || v.PgflowVersion.State != c.state {
				t.Fatalf("audit json: %+v", v.PgflowVersion)
			}

			if c.applyRC < 0 {
				return // applying to the real 0.16.0 is the upgrade itself, tested in cmd_apply_test.go
			}
			r = clitest.Run(t, env, "--format", "json", "apply", "--yes")
			if v := versionOf(t, r); r.Code != c.applyRC || v.PgflowVersion.Found != c.found || v.PgflowVersion.State != c.state ||
				!strings.Contains(r.Stdout, c.applyText) {
				t.Fatalf("apply: exit %d (want %d), %+v\n%s%s", r.Code, c.applyRC, v.PgflowVersion, r.Stdout, r.Stderr)
			}
			r = clitest.Run(t, env, "apply", "--yes")
			if r.Code != c.applyRC || !strings.Contains(r.Stdout, "next step: ") || !strings.Contains(r.Stdout+r.Stderr, c.applyText) {
				t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// A half-done online upgrade of ours: its phase and the command that continues it.
func TestStatusNamesAnOnlineUpgradeInProgress(t *testing.T) {
	db := testdb.Baseline(t)
	db.Exec(t, `alter table pgflow.steps add column queue_name text`)
	db.Exec(t, `alter table pgflow.step_tasks add column queue_name text`)
	env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}
	r := clitest.Run(t, env, "--format", "json", "status")
	v := versionOf(t, r)
	if r.Code != cli.ExitOK || v.PgflowVersion.State != "online_in_progress" || v.PgflowVersion.Online == nil ||
		v.PgflowVersion.Online.Phase != "backfill" || !strings.Contains(v.PgflowVersion.NextStep, "pgflow-upgrade apply --online") {
		t.Fatalf("status: exit %d %+v\n%s", r.Code, v.PgflowVersion, r.Stderr)
	}
	r = clitest.Run(t, env, "audit", "--check", "schema.state")
	if !strings.Contains(r.Stdout, "phase backfill") || !strings.Contains(r.Stdout, "pgflow-upgrade apply --online") {
		t.Fatalf("audit: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r = clitest.Run(t, env, "apply", "--yes")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout+r.Stderr, "run `pgflow-upgrade apply --online` to continue it") {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
