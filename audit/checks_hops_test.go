package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Every check declares when it runs; a hop's own checks are in the
// catalog once, after the checks of every plan, and only there.
func TestChecksDeclareWhenAndForWhichHop(t *testing.T) {
	seenHop := false
	for _, c := range audit.Checks() {
		if c.Runs == 0 {
			t.Errorf("%s declares no moment it runs at", c.ID)
		}
		if c.Hop != audit.EveryPlan {
			seenHop = true
			if c.Family() != "hops" {
				t.Errorf("%s belongs to hop %d but is not in family hops (checks_hops.go)", c.ID, c.Hop)
			}
		} else if seenHop {
			t.Errorf("%s (every plan) comes after a hop's check", c.ID)
		}
	}
	for _, id := range []string{"hops.valid_status", "hops.pg_cron"} {
		c, err := audit.Lookup(id)
		if err != nil || !c.Runs.Has(audit.InAudit|audit.UnderLocks) {
			t.Errorf("%s: %+v, %v: want it in the audit and under apply's locks", id, c, err)
		}
	}
}

// hopFindings are plan.hops' findings of check id.
func hopFindings(t *testing.T, rep *audit.Report, id string) []audit.Finding {
	t.Helper()
	var out []audit.Finding
	for _, f := range result(t, rep, "plan.hops").Findings {
		if f.CheckID == id {
			out = append(out, f)
		}
	}
	return out
}

// A hop's checks run for a plan that takes the hop, within plan.hops, and
// not for one that does not; they never run as checks of their own unless
// asked for by ID, and then say when the plan lacks their hop.
func TestHopChecksRunForTheirHopsOnly(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	old := runAudit(t, testdb.Upstream(t, "0.14.1"), audit.Options{})
	if fs := hopFindings(t, old, "hops.valid_status"); len(fs) != 1 || fs[0].Severity != audit.Info || fs[0].Count != 0 ||
		!strings.Contains(fs[0].Message, "0 step_tasks rows") {
		t.Fatalf("0.14.1, hop 22: %+v", fs)
	}
	if fs := hopFindings(t, old, "hops.pg_cron"); len(fs) != 1 || fs[0].Severity != audit.Info || !strings.Contains(fs[0].Message, "cron.schedule is there") {
		t.Fatalf("0.14.1, hop 26: %+v", fs)
	}
	for _, r := range old.Checks {
		if strings.HasPrefix(r.ID, "hops.") {
			t.Fatalf("a hop's check ran on its own: %+v", r)
		}
	}

	newer := testdb.Upstream(t, "0.17.1") // its plan is file 27 only
	rep := runAudit(t, newer, audit.Options{})
	for _, id := range []string{"hops.valid_status", "hops.owned_queue_missing", "hops.pg_cron"} {
		if fs := hopFindings(t, rep, id); len(fs) != 0 {
			t.Fatalf("0.17.1: %s ran: %+v", id, fs)
		}
	}
	asked := runAudit(t, newer, audit.Options{Checks: []string{"hops.valid_status"}})
	if r := result(t, asked, "hops.valid_status"); r.Status != audit.StatusSkipped || !strings.Contains(r.Error, "no hop to upstream's file 22") {
		t.Fatalf("0.17.1, asked for by ID: %+v", r)
	}
}

// hops.valid_status counts the rows 0.15.1's CHECK rejects (a blocker),
// and reads no row where a validated CHECK with its definition exists.
func TestHopValidStatus(t *testing.T) {
	ctx := context.Background()
	db := testdb.Upstream(t, "0.14.1")
	if err := fixtures.LoadInflightRuns(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	// A row no release's CHECK admits (put there while the CHECK was
	// away, as a restore or a hand edit can), under 0.14.1's own catalog.
	db.Exec(t, `alter table pgflow.step_tasks drop constraint valid_status`,
		`update pgflow.step_tasks set status = 'paused' where ctid = (select min(ctid) from pgflow.step_tasks where status = 'queued')`,
		`alter table pgflow.step_tasks add constraint valid_status check (status = any (array['queued'::text, 'started'::text, 'completed'::text, 'failed'::text])) not valid`,
		`update pg_catalog.pg_constraint set convalidated = true where conname = 'valid_status' and conrelid = 'pgflow.step_tasks'::regclass`)
	rep := only(t, db, audit.Options{}, "plan.hops")
	if fs := hopFindings(t, rep, "hops.valid_status"); len(fs) != 1 || fs[0].Severity != audit.Blocker || fs[0].Count != 1 ||
		!strings.Contains(fs[0].Message, "1 step_tasks rows") {
		t.Fatalf("a rejected row: %+v", fs)
	}

	// A validated CHECK of 0.15.1's definition: no scan of step_tasks.
	db.Exec(t, `update pgflow.step_tasks set status = 'queued' where status = 'paused'`,
		`alter table pgflow.step_tasks add constraint any_name check (status = any (array['queued', 'started', 'completed', 'failed', 'skipped', 'cancelled']))`)
	reads := func(t *testing.T) int64 {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		scans := func() (n int64) {
			if err := tx.QueryRow(ctx, `select coalesce(seq_scan, 0) + coalesce(idx_scan, 0) from pg_stat_xact_user_tables
				where relid = 'pgflow.step_tasks'::regclass`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := scans()
		res, err := audit.RunPreflight(ctx, tx, audit.Options{Hop: 22})
		if err != nil || len(res) != 1 || res[0].ID != "hops.valid_status" || audit.Blockers(res) != 0 || res[0].Status != audit.StatusFindings {
			t.Fatalf("preflight of hop 22: %+v, %v", res, err)
		}
		return scans() - before
	}
	if n := reads(t); n != 0 {
		t.Fatalf("%d scans of step_tasks under a validated CHECK", n)
	}
	db.Exec(t, `alter table pgflow.step_tasks drop constraint any_name`,
		`alter table pgflow.step_tasks add constraint any_name check (status = any (array['queued', 'started', 'completed', 'failed', 'skipped', 'cancelled'])) not valid`)
	if n := reads(t); n == 0 {
		t.Fatal("no scan of step_tasks under a CHECK not validated")
	}
}

// hops.pg_cron is info in the audit and a blocker under apply's locks when
// cron.schedule is missing.
func TestHopPgCron(t *testing.T) {
	ctx := context.Background()
	db := testdb.Upstream(t, "0.17.0")
	db.DropCron(t)
	rep := only(t, db, audit.Options{}, "plan.hops")
	if fs := hopFindings(t, rep, "hops.pg_cron"); len(fs) != 1 || fs[0].Severity != audit.Info || !strings.Contains(fs[0].Message, "cron.schedule is MISSING") {
		t.Fatalf("audit: %+v", fs)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := audit.RunPreflight(ctx, tx, audit.Options{Hop: 26})
	if err != nil || len(res) != 1 || audit.Blockers(res) != 1 || res[0].Findings[0].CheckID != "hops.pg_cron" {
		t.Fatalf("preflight of hop 26: %+v, %v", res, err)
	}
}

// 0.17.1 rejects a step-mode route whose queue is missing: a warning at
// the hop that brings the rule (file 25), for a plan from 0.17.0.
func TestHopOwnedQueueMissing(t *testing.T) {
	db := testdb.Upstream(t, "0.17.0")
	step := `{"slug": "%s", "stepType": "single", "dependencies": [], "whenUnmet": "skip", "whenExhausted": "fail",
		"requiredInputPattern": {"defined": false}, "forbiddenInputPattern": {"defined": false}}`
	db.Exec(t, `select pgflow.ensure_flow_compiled('Sq', '{"steps": [`+strings.ReplaceAll(step, "%s", "a")+`, `+strings.ReplaceAll(step, "%s", "b")+`]}', 'step')`)
	if fs := hopFindings(t, only(t, db, audit.Options{}, "plan.hops"), "hops.owned_queue_missing"); len(fs) != 0 {
		t.Fatalf("every queue there: %+v", fs)
	}
	db.Exec(t, `select pgmq.drop_queue('sq__b')`)
	fs := hopFindings(t, only(t, db, audit.Options{}, "plan.hops"), "hops.owned_queue_missing")
	if len(fs) != 1 || fs[0].Severity != audit.Warning || fs[0].Count != 1 || !sampleHas(fs[0], "expected_queue", "sq__b") ||
		!strings.Contains(fs[0].Message, "0.17.1") {
		t.Fatalf("a missing step queue: %+v", fs)
	}
}
