package fleet_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// verifyCode is the single verify's exit code on db: 0 once upgraded.
func verifyCode(t *testing.T, db *testdb.DB) int {
	t.Helper()
	return clitest.Run(t, nil, "verify", "--dsn", db.DSN).Code
}

// sameRows fails unless every row and message of before is in after,
// unchanged (columns the upgrade adds aside).
func sameRows(t *testing.T, name string, before *fingerprint.Fingerprint, db *testdb.DB) {
	t.Helper()
	after := db.Fingerprint(t)
	if d := fingerprint.Compare(before, after); len(d) > 0 || after.RowCount() != before.RowCount() {
		t.Errorf("%s: %d rows and messages before, %d after:\n%s", name, before.RowCount(), after.RowCount(), fingerprint.Format(d, 10))
	}
}

// TestFleetApplyStaged: a failing canary starts nothing else; then one
// canary, and the failure limit stops the run at the blocked target; a
// rerun with the ledger skips the upgraded canary (verified again) and
// the blocked target (failed in the same state), upgrades the rest; once
// the blocker is fixed, the next rerun audits it again and upgrades it.
func TestFleetApplyStaged(t *testing.T) {
	c1, block, c2, c3 := clitest.LegacyDB(t), blocked(t), clitest.LegacyDB(t), clitest.LegacyDB(t)
	fps := map[string]*fingerprint.Fingerprint{"c1": c1.Fingerprint(t), "blocked": block.Fingerprint(t), "c2": c2.Fingerprint(t), "c3": c3.Fingerprint(t)}
	dbs := map[string]*testdb.DB{"c1": c1, "blocked": block, "c2": c2, "c3": c3}

	// A canary that fails: nothing else starts.
	first := writeTargets(t, "blocked "+block.DSN, "c2 "+c2.DSN)
	r := clitest.Run(t, nil, "fleet", "apply", "--yes", "--targets", first, "--canary", "1", "--format", "json")
	doc := report(t, r)
	if r.Code != cli.ExitFindings || entry(t, doc, "c2")["status"] != "not_started" || !strings.Contains(mustJSON(doc["stopped"]), "canary blocked failed") {
		t.Fatalf("failing canary: exit %d\n%s", r.Code, r.Stdout)
	}
	if verifyCode(t, c2) != cli.ExitFindings {
		t.Fatal("c2 was upgraded although the canary failed")
	}

	targets := writeTargets(t, "c1 "+c1.DSN, "blocked "+block.DSN, "c2 "+c2.DSN, "c3 "+c3.DSN)
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	args := []string{"fleet", "apply", "--yes", "--targets", targets, "--ledger", ledger, "--canary", "1", "--parallel", "1", "--format", "json"}
	r = clitest.Run(t, nil, args...)
	doc = report(t, r)
	if r.Code != cli.ExitFindings {
		t.Fatalf("exit %d, want 1\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for name, want := range map[string]string{"c1": "applied", "blocked": "refused", "c2": "NOT STARTED", "c3": "NOT STARTED"} {
		if e := entry(t, doc, name); e["verdict"] != want {
			t.Errorf("%s: verdict %v, want %s: %v", name, e["verdict"], want, e)
		}
	}
	if !strings.Contains(mustJSON(doc["stopped"]), "--max-failures 1") || verifyCode(t, c1) != 0 || verifyCode(t, c2) == 0 {
		t.Fatalf("stopped %v; c1 verify %d, c2 verify %d", doc["stopped"], verifyCode(t, c1), verifyCode(t, c2))
	}

	// Rerun: c1 checked and skipped, blocked skipped (same state), c2 and c3 upgraded.
	r = clitest.Run(t, nil, args...)
	doc = report(t, r)
	if r.Code != cli.ExitFindings {
		t.Fatalf("rerun: exit %d, want 1 (blocked's recorded failure)\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if e := entry(t, doc, "c1"); e["status"] != "skipped" || !strings.Contains(e["note"].(string), "verify passes again") {
		t.Errorf("c1 on the rerun: %v", e)
	}
	if e := entry(t, doc, "blocked"); e["status"] != "skipped" || !strings.Contains(e["note"].(string), "same state") {
		t.Errorf("blocked on the rerun: %v", e)
	}
	for _, name := range []string{"c2", "c3"} {
		if e := entry(t, doc, name); e["verdict"] != "applied" || e["exit_code"].(float64) != 0 || verifyCode(t, dbs[name]) != 0 {
			t.Errorf("%s on the rerun: %v", name, e)
		}
	}

	// The blocker fixed: its state changed, so it is audited again and upgraded.
	block.Exec(t, `delete from pgflow.flows where flow_slug = 'Foo'`)
	fps["blocked"] = block.Fingerprint(t)
	r = clitest.Run(t, nil, args...)
	doc = report(t, r)
	if e := entry(t, doc, "blocked"); r.Code != cli.ExitOK || e["verdict"] != "applied" || !strings.Contains(e["note"].(string), "state changed") {
		t.Fatalf("after the fix: exit %d, blocked %v\n%s", r.Code, e, r.Stderr)
	}
	for name, fp := range fps {
		sameRows(t, name, fp, dbs[name])
	}

	// fleet verify and fleet status read what the single commands read.
	r = clitest.Run(t, nil, "fleet", "verify", "--targets", targets, "--format", "json")
	doc = report(t, r)
	if r.Code != cli.ExitOK || entry(t, doc, "c2")["verdict"] != "PASS" || len(doc["groups"].([]any)) != 1 {
		t.Errorf("fleet verify: exit %d\n%s", r.Code, r.Stdout)
	}
	r = clitest.Run(t, nil, "fleet", "status", "--targets", targets, "--format", "json")
	doc = report(t, r)
	if single := clitest.Run(t, nil, "status", "--dsn", c1.DSN); r.Code != single.Code || entry(t, doc, "c1")["release"] == "" {
		t.Errorf("fleet status: exit %d, the single status %d\n%s", r.Code, single.Code, r.Stdout)
	}
}

// TestLongFleetApplyResumeAfterKill: a fleet apply is killed with SIGKILL
// after two of five targets; the rerun with its ledger skips those two
// (verified at the destination), finishes the rest, and every target keeps
// every row and message it had.
func TestLongFleetApplyResumeAfterKill(t *testing.T) {
	testdb.SkipUnlessLong(t, "a SIGKILLed fleet apply resumes from its ledger")
	const n = 5
	dbs := make([]*testdb.DB, n)
	fps := make([]*fingerprint.Fingerprint, n)
	var lines []string
	for i := range dbs {
		dbs[i] = clitest.LegacyDB(t)
		fps[i] = dbs[i].Fingerprint(t)
		lines = append(lines, "t"+string(rune('1'+i))+" "+dbs[i].DSN)
	}
	targets := writeTargets(t, lines...)
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	args := []string{"fleet", "apply", "--yes", "--targets", targets, "--ledger", ledger, "--parallel", "1", "--format", "json"}

	killAfter(t, args, ledger, 2, time.Minute)
	killedAt := countDone(ledger)
	// The killed run's ledger as a report: what was done, what was running
	// (unfinished, exit 4), nothing claimed for the rest.
	rep := clitest.Run(t, nil, "fleet", "report", "--format", "json", ledger)
	if doc := report(t, rep); rep.Code == cli.ExitOK || entry(t, doc, "t5")["verdict"] != "NOT RUN" {
		t.Errorf("report of the killed run's ledger: exit %d\n%s", rep.Code, rep.Stdout)
	}

	r := clitest.Run(t, nil, args...)
	doc := report(t, r)
	if r.Code != cli.ExitOK {
		t.Fatalf("rerun: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	skipped := 0
	for i, db := range dbs {
		e := entry(t, doc, "t"+string(rune('1'+i)))
		if e["status"] == "skipped" {
			skipped++
		}
		if verifyCode(t, db) != 0 {
			t.Errorf("%v: not upgraded after the rerun", e["name"])
		}
		sameRows(t, e["name"].(string), fps[i], db)
	}
	if skipped != killedAt {
		t.Errorf("the rerun skipped %d targets, the ledger had %d done:\n%s", skipped, killedAt, r.Stdout)
	}
}

// countDone is how many targets a ledger records as done.
func countDone(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var l struct {
		Entries []struct {
			Status string `json:"status"`
		} `json:"entries"`
	}
	if json.Unmarshal(data, &l) != nil {
		return 0
	}
	n := 0
	for _, e := range l.Entries {
		if e.Status == "done" {
			n++
		}
	}
	return n
}

// TestLongFleetApplyOnlineAndInterrupt: apply --online is given to every
// target; a SIGINT to a running fleet starts no new target, the running
// one commits or rolls back, the ledger says so (exit 130), and the rerun
// finishes.
func TestLongFleetApplyOnlineAndInterrupt(t *testing.T) {
	testdb.SkipUnlessLong(t, "fleet apply --online, and SIGINT starting no new target")
	dbs := []*testdb.DB{clitest.LegacyDB(t), clitest.LegacyDB(t), clitest.LegacyDB(t), clitest.LegacyDB(t)}
	fps := make([]*fingerprint.Fingerprint, len(dbs))
	var lines []string
	for i, db := range dbs {
		fps[i] = db.Fingerprint(t)
		lines = append(lines, "t"+string(rune('1'+i))+" "+db.DSN)
	}
	targets := writeTargets(t, lines...)
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	args := []string{"fleet", "apply", "--yes", "--online", "--targets", targets, "--ledger", ledger, "--parallel", "1", "--format", "json"}

	var out strings.Builder
	cmd := startTool(t, &out, args)
	waitDone(ledger, 1, time.Minute)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != cli.ExitInterrupted {
		t.Fatalf("after SIGINT: %v, want exit 130\n%s", err, out.String())
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out.String()), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if e := entry(t, doc, "t1"); e["verdict"] != "applied" || e["release"] == "" {
		t.Errorf("t1 (apply --online): %v", e)
	}
	if !strings.Contains(mustJSON(doc["stopped"]), "interrupted") || entry(t, doc, "t4")["status"] != "not_started" {
		t.Errorf("stopped %v, t4 %v", doc["stopped"], entry(t, doc, "t4"))
	}
	for i, db := range dbs {
		// Upgraded, or not: an online upgrade cut short is resumable, and
		// status names it.
		e := entry(t, doc, fmt.Sprintf("t%d", i+1))
		switch e["status"] {
		case "done", "interrupted", "not_started":
		default:
			t.Errorf("t%d after the interrupt: %v", i+1, e)
		}
		st := clitest.Run(t, nil, "status", "--dsn", db.DSN)
		first, _, _ := strings.Cut(st.Stdout, "\n")
		t.Logf("t%d after the interrupt: %s %s; status: %s", i+1, e["status"], e["verdict"], first)
	}
	r := clitest.Run(t, nil, args...)
	if r.Code != cli.ExitOK {
		t.Fatalf("rerun: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for i, db := range dbs {
		if verifyCode(t, db) != 0 {
			t.Errorf("t%d not upgraded after the rerun", i+1)
		}
		sameRows(t, fmt.Sprintf("t%d", i+1), fps[i], db)
	}
}

// TestFleetReplayScenario: `fixtures replay fleet-staged` passes on the
// test server (its fleet audit, staged apply and rerun with the ledger).
func TestFleetReplayScenario(t *testing.T) {
	testdb.SkipIfShort(t, "fixtures replay fleet-staged: the fleet's replay scenario passes (four databases, three fleet runs)")
	env := map[string]string{"PGFLOW_UPGRADE_NO_DOCKER": "1", "PGFLOW_UPGRADE_DSN": testdb.Server(t).AdminDSN()}
	r := clitest.Run(t, env, "fixtures", "replay", "fleet-staged")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "fleet-staged") || !strings.Contains(r.Stdout, "1 passed") {
		t.Fatalf("exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
}
