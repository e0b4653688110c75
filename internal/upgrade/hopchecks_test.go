package upgrade_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// A hop's own checks (audit's hops.*) run under the locks right before
// their hop: a step_tasks row 0.15.1's CHECK rejects refuses the hop to
// file 22, naming the file and the count, and nothing changes.
func TestApplyRefusesRowsFile22Rejects(t *testing.T) {
	db := upstreamInflight(t, "0.14.1")
	// A row no release's CHECK admits (put there while the CHECK was
	// away), under 0.14.1's own catalog.
	db.Exec(t, `alter table pgflow.step_tasks drop constraint valid_status`,
		`update pgflow.step_tasks set status = 'paused' where ctid = (select min(ctid) from pgflow.step_tasks where status = 'queued')`,
		`alter table pgflow.step_tasks add constraint valid_status check (status = any (array['queued'::text, 'started'::text, 'completed'::text, 'failed'::text])) not valid`,
		`update pg_catalog.pg_constraint set convalidated = true where conname = 'valid_status' and conrelid = 'pgflow.step_tasks'::regclass`)
	before := testdb.State(t, db.Pool)
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
	file := versions.UpstreamFiles()[21].Name
	if !errors.Is(err, outcome.ErrPreflight) || res.Outcome != outcome.Refused ||
		!strings.Contains(err.Error(), "before upstream's "+file+": 1 missing or failing: step_tasks rows with a status 0.15.1's valid_status CHECK rejects") {
		t.Fatalf("got %v (%s)", err, res.Outcome)
	}
	if b := res.Report.Blockers; len(b) != 1 || b[0].CheckID != "hops.valid_status" || b[0].Count != 1 {
		t.Fatalf("blockers %+v", b)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "a refused apply")
}

// Without pg_cron's cron.schedule, a plan that takes the telemetry file
// (from 0.17.0) is refused before it; one that does not (from 0.17.1, the
// endpoint fix only) never runs that check and applies.
func TestApplyHopCheckRunsOnlyForItsHop(t *testing.T) {
	file := versions.UpstreamFiles()[25].Name
	t.Run("0.17.0", func(t *testing.T) {
		db := testdb.Upstream(t, "0.17.0")
		db.DropCron(t)
		before := testdb.State(t, db.Pool)
		opts := fastOpts()
		opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
		res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
		if !errors.Is(err, outcome.ErrPreflight) || res.Outcome != outcome.Refused ||
			!strings.Contains(err.Error(), "before upstream's "+file+": 1 missing or failing: pg_cron's cron.schedule(text, text, text)") {
			t.Fatalf("got %v (%s)", err, res.Outcome)
		}
		testdb.SameState(t, before, testdb.State(t, db.Pool), "a refused apply")
	})
	t.Run("0.17.1", func(t *testing.T) {
		db := testdb.Upstream(t, "0.17.1")
		db.DropCron(t)
		opts := fastOpts()
		opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
		res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
		if err != nil || res.Outcome != outcome.Applied || res.Report.VersionNow != versions.Newest {
			t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
		}
	})
}
