package fleet_test

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// longTarget is one database of the 50-database fleet.
type longTarget struct {
	name       string
	dsn        string
	db         *testdb.DB // nil: not a database of the test server
	upgradable bool       // apply takes it to the destination (or it is there)
	fp         *fingerprint.Fingerprint
}

// TestLongFleet50: one server with 50 databases in mixed states (30 clean
// 0.16.0, 5 with a blocker, 3 upgraded by apply, 2 built from upstream's
// 0.17.0 files, 4 at upstream's newest release, 4 at 0.14.1) and one
// unreachable target and one with a wrong password. fleet audit groups
// them by state and exits with the worst code; fleet apply --canary 1
// --parallel 4 (with the user's copy of upstream's files and --telemetry
// off, given to every target) killed with SIGKILL in the middle, rerun, stops at the
// failure limit; a rerun without the limit finishes: every upgradable
// database upgraded, the targets done before skipped, nothing lost (every
// row and message of every database the same before and after).
func TestLongFleet50(t *testing.T) {
	testdb.SkipUnlessLong(t, "fleet audit and a killed, resumed fleet apply over 50 databases in mixed states (about a minute)")
	t.Logf("components: pgmq %s; upstream databases: %s", testdb.PGMQKindInUse(), testdb.UpstreamComponents())
	var ts []longTarget
	numbered := map[string]int{}
	add := func(prefix string, n int, upgradable bool, make func(t *testing.T) *testdb.DB) {
		for range n {
			db := make(t)
			numbered[prefix]++
			ts = append(ts, longTarget{name: fmt.Sprintf("%s-%02d", prefix, numbered[prefix]), dsn: db.DSN, db: db, upgradable: upgradable})
		}
	}
	add("clean", 15, true, clitest.LegacyDB)
	add("blocked", 2, false, blocked)
	add("v0141", 4, true, func(t *testing.T) *testdb.DB { return testdb.Upstream(t, "0.14.1") })
	add("upgraded", 3, true, clitest.UpgradedDB)
	add("up0170", 2, true, func(t *testing.T) *testdb.DB { return testdb.Upstream(t, "0.17.0") })
	add("newest", 4, true, func(t *testing.T) *testdb.DB { return testdb.Upstream(t, testdb.NewestRelease) })
	add("clean", 15, true, clitest.LegacyDB)
	add("blocked", 3, false, blocked)
	pw := clitest.PasswordServer(t, "fleet_pw")
	pw.User = url.UserPassword("fleet_pw", secretPassword)
	ts = append(ts, longTarget{name: "gone", dsn: unreachableDSN(t)}, longTarget{name: "wrongpw", dsn: pw.String()})
	if len(ts) != 50 {
		t.Fatalf("%d targets, want 50", len(ts))
	}
	var lines []string
	for i := range ts {
		lines = append(lines, ts[i].name+" "+ts[i].dsn)
		if ts[i].db != nil {
			ts[i].fp = ts[i].db.Fingerprint(t)
		}
	}
	targets := writeTargets(t, lines...)

	// Audit: grouped, worst exit code.
	r := clitest.Run(t, nil, "fleet", "audit", "--targets", targets, "--parallel", "8", "--format", "json")
	doc := report(t, r)
	if r.Code != cli.ExitEnvironment || strings.Contains(r.Stdout+r.Stderr, secretPassword) {
		t.Fatalf("fleet audit: exit %d, want 3\n%s", r.Code, r.Stderr)
	}
	sizes := map[string]float64{}
	for _, g := range doc["groups"].([]any) {
		g := g.(map[string]any)
		sizes[g["like"].(string)] = g["size"].(float64)
	}
	t.Logf("groups (first target: size): %v", sizes)
	if sizes["clean-01"] != 30 || sizes["blocked-01"] != 5 || sizes["v0141-01"] != 4 || sizes["newest-01"] != 4 {
		t.Errorf("groups: %v", sizes)
	}
	for _, name := range []string{"clean-07", "blocked-02", "v0141-03", "up0170-01", "newest-02", "upgraded-01"} {
		var tg longTarget
		for _, x := range ts {
			if x.name == name {
				tg = x
			}
		}
		single := clitest.Run(t, nil, "audit", "--dsn", tg.dsn)
		if e := entry(t, doc, name); int(e["exit_code"].(float64)) != single.Code {
			t.Errorf("%s: fleet exit %v, the single audit %d", name, e["exit_code"], single.Code)
		}
	}

	// Apply, killed in the middle.
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	// The user's copy of upstream's files takes 0.14.1 and 0.17.0 to the
	// newest release too; --telemetry off opts every target out.
	args := []string{"fleet", "apply", "--yes", "--targets", targets, "--ledger", ledger, "--canary", "1", "--parallel", "4", "--format", "json",
		"--pgflow-migrations", testdb.PgflowInstalledCopy(t, 27), "--telemetry", "off"}
	killAfter(t, args, ledger, 8, 3*time.Minute)
	killedAt := countDone(ledger)

	// The rerun skips what was done, and stops at the failure limit (1).
	r = clitest.Run(t, nil, args...)
	doc = report(t, r)
	if r.Code == cli.ExitOK || !strings.Contains(mustJSON(doc["stopped"]), "--max-failures 1") {
		t.Fatalf("rerun: exit %d, stopped %v", r.Code, doc["stopped"])
	}
	skipped, notStarted := 0, 0
	for _, e := range doc["entries"].([]any) {
		switch e.(map[string]any)["status"] {
		case "skipped":
			skipped++
		case "not_started":
			notStarted++
		}
	}
	if skipped < killedAt || notStarted == 0 {
		t.Errorf("rerun after the kill: %d skipped (the ledger had %d done), %d not started", skipped, killedAt, notStarted)
	}

	// Without the limit: everything upgradable is upgraded.
	r = clitest.Run(t, nil, append(args, "--max-failures", "0")...)
	doc = report(t, r)
	if r.Code != cli.ExitEnvironment {
		t.Errorf("last run: exit %d, want 3 (the unreachable targets)\n%s", r.Code, r.Stderr)
	}
	for _, x := range ts {
		e := entry(t, doc, x.name)
		if x.db == nil {
			continue
		}
		upgradedNow := verifyCode(t, x.db) == 0
		if upgradedNow != x.upgradable {
			t.Errorf("%s: verify passes %v, want %v (%v)", x.name, upgradedNow, x.upgradable, e)
		}
		sameRows(t, x.name, x.fp, x.db)
	}
}
