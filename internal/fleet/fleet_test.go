package fleet_test

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestFleetAudit: six databases in mixed states (two clean 0.16.0, one
// with a blocker, one upgraded, one unreachable, one with a wrong
// password). fleet audit groups the two clean ones, gives every target the
// exit code and blockers the single audit gives it, names why the two
// without an answer have none (no password printed), and exits with the
// worst code. Two shards merged by fleet report equal the unsharded run.
func TestFleetAudit(t *testing.T) {
	t.Logf("components: %s", testdb.PGMQKindInUse())
	cleanA, cleanB, block, up := clitest.LegacyDB(t), clitest.LegacyDB(t), blocked(t), clitest.UpgradedDB(t)
	wrong := "postgres://127.0.0.1:1/x" // replaced below unless -short
	wrongCause := "connect"
	pgpass := ""
	if testing.Short() {
		t.Log("-short: the wrong-password target is a second unreachable one (a cluster with password authentication starts only in make test)")
	} else {
		u := clitest.PasswordServer(t, "fleet_pw")
		u.User = url.UserPassword("fleet_pw", secretPassword)
		wrong = u.String()
		// A DSN without a password: the password file, as libpq reads it.
		u.User = url.User("fleet_pw")
		pgpass = u.String()
		passfile := filepath.Join(t.TempDir(), "pgpass")
		if err := os.WriteFile(passfile, []byte("127.0.0.1:"+u.Port()+":*:fleet_pw:"+clitest.RightPassword+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv("PGPASSFILE", passfile)
		wrongCause = "password authentication failed"
	}
	targets := writeTargets(t,
		"# six databases",
		"clean-a "+cleanA.DSN,
		"blocked "+block.DSN,
		"",
		"clean-b "+cleanB.DSN,
		"upgraded "+up.DSN,
		"gone "+unreachableDSN(t),
		"wrongpw "+wrong,
	)
	if pgpass != "" {
		// Reaches the server: the role's postgres database, no pgflow in it.
		r := clitest.Run(t, nil, "fleet", "audit", "--targets", writeTargets(t, "pgpass "+pgpass), "--format", "json")
		if e := entry(t, report(t, r), "pgpass"); e["verdict"] == "UNREACHABLE" || e["schema_state"] != "not_pgflow" {
			t.Errorf("a DSN without a password and PGPASSFILE: %v\n%s", e, r.Stderr)
		}
	}
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.json")
	tr := clitest.Run(t, nil, "fleet", "audit", "--targets", targets, "--parallel", "3", "--ledger", whole)
	r := clitest.Run(t, nil, "fleet", "report", "--format", "json", whole)
	if strings.Contains(tr.Stdout+tr.Stderr+r.Stdout, secretPassword) {
		t.Fatalf("the password is printed:\n%s\n%s", r.Stdout, r.Stderr)
	}
	doc := report(t, r)
	if r.Code != cli.ExitEnvironment || doc["exit_code"].(float64) != cli.ExitEnvironment {
		t.Fatalf("exit %d, want %d (the worst: unreachable targets)\n%s\n%s", r.Code, cli.ExitEnvironment, r.Stdout, r.Stderr)
	}

	// Every audited target: what the single audit says of it.
	for name, db := range map[string]*testdb.DB{"clean-a": cleanA, "clean-b": cleanB, "blocked": block, "upgraded": up} {
		single := clitest.Run(t, nil, "audit", "--dsn", db.DSN, "--format", "json")
		var s struct {
			Summary struct {
				Blockers int `json:"blockers"`
				Warnings int `json:"warnings"`
			} `json:"summary"`
			PgflowVersion struct {
				Found string `json:"found"`
			} `json:"pgflow_version"`
		}
		if err := json.Unmarshal([]byte(single.Stdout), &s); err != nil {
			t.Fatal(err)
		}
		e := entry(t, doc, name)
		if int(e["exit_code"].(float64)) != single.Code || e["release"] != s.PgflowVersion.Found ||
			len(e["blockers"].([]any)) > s.Summary.Blockers || (s.Summary.Blockers > 0) != (len(e["blockers"].([]any)) > 0) {
			t.Errorf("%s: fleet entry %v; the single audit exits %d, release %s, %d blockers", name, e, single.Code, s.PgflowVersion.Found, s.Summary.Blockers)
		}
	}
	if e := entry(t, doc, "blocked"); e["verdict"] != "NO-GO" || !strings.Contains(mustJSON(e["blockers"]), "case") {
		t.Errorf("blocked: %v", e)
	}
	if e := entry(t, doc, "upgraded"); e["release"] != "0.17.0" {
		t.Errorf("upgraded: release %v", e["release"])
	}

	// Groups: the two clean ones together, the others alone; the two
	// without an answer listed with their causes.
	groups := doc["groups"].([]any)
	if len(groups) != 3 {
		t.Fatalf("%d groups, want 3: %s", len(groups), mustJSON(groups))
	}
	first := groups[0].(map[string]any)
	if first["like"] != "clean-a" || first["size"].(float64) != 2 || mustJSON(first["targets"]) != `["clean-a","clean-b"]` {
		t.Errorf("first group: %v", first)
	}
	if mustJSON(doc["unreached"]) != `["gone","wrongpw"]` {
		t.Errorf("unreached: %v", doc["unreached"])
	}
	if e := entry(t, doc, "gone"); e["verdict"] != "UNREACHABLE" || e["exit_code"].(float64) != 3 || !strings.Contains(e["cause"].(string), "connect") {
		t.Errorf("gone: %v", e)
	}
	if e := entry(t, doc, "wrongpw"); e["exit_code"].(float64) != 3 || !strings.Contains(e["cause"].(string), wrongCause) {
		t.Errorf("wrongpw: %v", e)
	}

	// The table says the same for a person, the verdict first.
	if !strings.HasPrefix(tr.Stdout, "CANNOT TELL: 6 targets") || !strings.Contains(tr.Stdout, "2 databases in the same state as clean-a") ||
		!strings.Contains(tr.Stdout, "no answer from 2 targets") || tr.Code != cli.ExitEnvironment {
		t.Errorf("table (exit %d):\n%s\n%s", tr.Code, tr.Stdout, tr.Stderr)
	}
	t.Logf("fleet audit:\n%s", tr.Stdout)

	t.Run("shards merge into the unsharded report", func(t *testing.T) { checkShards(t, targets, whole, tr) })
	t.Run("markdown and junit", func(t *testing.T) { checkMarkdownJUnit(t, whole) })
}

// checkShards: two shards of targets, each with its ledger, merged by
// fleet report, print what the unsharded run (tr, its ledger whole) printed.
func checkShards(t *testing.T, targets, whole string, tr clitest.Result) {
	dir := t.TempDir()
	one, two := filepath.Join(dir, "1.json"), filepath.Join(dir, "2.json")
	full := clitest.Run(t, nil, "fleet", "report", whole)
	if full.Stdout != tr.Stdout || full.Code != tr.Code {
		t.Errorf("fleet report of the run's ledger (exit %d):\n%s\nthe run (exit %d):\n%s", full.Code, full.Stdout, tr.Code, tr.Stdout)
	}
	r1 := clitest.Run(t, nil, "fleet", "audit", "--targets", targets, "--shard", "1/2", "--ledger", one)
	r2 := clitest.Run(t, nil, "fleet", "audit", "--targets", targets, "--shard", "2/2", "--ledger", two)
	if r1.Code == cli.ExitUsage || r2.Code == cli.ExitUsage {
		t.Fatalf("shards: %s %s", r1.Stderr, r2.Stderr)
	}
	// Both shards have targets: the merge below merges something.
	for _, r := range []clitest.Result{r1, r2} {
		if strings.Contains(r.Stderr, ": 0 of the 6 targets") || strings.Contains(r.Stderr, ": 6 of the 6 targets") {
			t.Fatalf("a shard with all or none of the targets:\n%s", r.Stderr)
		}
	}
	merged := clitest.Run(t, nil, "fleet", "report", one, two)
	if merged.Stdout != full.Stdout || merged.Code != full.Code {
		t.Errorf("merged shards (exit %d):\n%s\nunsharded (exit %d):\n%s", merged.Code, merged.Stdout, full.Code, full.Stdout)
	}
	mj, fj := clitest.Run(t, nil, "fleet", "report", "--format", "json", one, two), clitest.Run(t, nil, "fleet", "report", "--format", "json", whole)
	if a, b := withoutTimes(t, mj.Stdout), withoutTimes(t, fj.Stdout); !reflect.DeepEqual(a, b) {
		t.Errorf("JSON of the merged shards differs from the unsharded run's:\n%s\n%s", mj.Stdout, fj.Stdout)
	}
	// One shard alone: its targets are reported, the others "not run".
	half := clitest.Run(t, nil, "fleet", "report", one)
	if !strings.Contains(half.Stderr, "shard 2/2: no ledger given") || !strings.Contains(half.Stdout, "NOT RUN") {
		t.Errorf("one shard of two:\n%s\n%s", half.Stdout, half.Stderr)
	}
}

// checkMarkdownJUnit: the Markdown report and one JUnit case per target.
func checkMarkdownJUnit(t *testing.T, whole string) {
	junit := filepath.Join(t.TempDir(), "fleet.xml")
	md := clitest.Run(t, nil, "fleet", "report", "--format", "markdown", "--junit", junit, whole)
	if !strings.HasPrefix(md.Stdout, "## pgflow-upgrade fleet audit: CANNOT TELL") || !strings.Contains(md.Stdout, "### 2 databases in the same state as clean-a") ||
		!strings.Contains(md.Stdout, "| clean-b |") {
		t.Errorf("markdown:\n%s", md.Stdout)
	}
	x, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(x), "<testcase "); n != 6 || strings.Count(string(x), "<failure ") != 3 {
		t.Errorf("junit: %d test cases, want 6 with 3 failures:\n%s", n, x)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// withoutTimes is a JSON report without its entries' times.
func withoutTimes(t *testing.T, s string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(s), &doc); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	for _, e := range doc["entries"].([]any) {
		delete(e.(map[string]any), "started_at")
		delete(e.(map[string]any), "finished_at")
	}
	return doc
}

// TestFleetUsage: what the fleet refuses before it connects anywhere, and
// the warning for a targets file others can read.
func TestFleetUsage(t *testing.T) {
	bad := writeTargets(t, "ok "+unreachableDSN(t), "x postgres://u:"+secretPassword+"@h:notaport/d")
	r := clitest.Run(t, nil, "fleet", "audit", "--targets", bad)
	if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, "line 2") || strings.Contains(r.Stderr, secretPassword) {
		t.Errorf("bad line: exit %d\n%s", r.Code, r.Stderr)
	}
	open := writeTargets(t, "gone postgres://u:"+secretPassword+"@"+strings.TrimPrefix(unreachableDSN(t), "postgres://postgres@"))
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	r = clitest.Run(t, nil, "fleet", "status", "--targets", open, "--format", "markdown")
	if r.Code != cli.ExitEnvironment || !strings.Contains(r.Stderr, "readable by its group or others") || strings.Contains(r.Stdout+r.Stderr, secretPassword) ||
		!strings.Contains(r.Stdout, "### No answer (1)") {
		t.Errorf("open targets file: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	// The single command's flags reach every target as typed: its own
	// check of them answers (a usage error is the target's, exit 2).
	r = clitest.Run(t, nil, "fleet", "apply", "--yes", "--telemetry", "maybe", "--targets", open, "--format", "json")
	if e := entry(t, report(t, r), "gone"); r.Code != cli.ExitUsage || !strings.Contains(e["cause"].(string), "--telemetry") {
		t.Errorf("--telemetry maybe: exit %d, %v", r.Code, e)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet", "apply", "--targets", open}, "pass --yes"},
		{[]string{"fleet", "audit"}, "missing required flag --targets"},
		{[]string{"fleet", "audit", "--targets", open, "--shard", "3/2"}, "--shard"},
		{[]string{"fleet", "audit", "--targets", open, "--parallel", "0"}, "--parallel"},
		{[]string{"audit", "--format", "markdown"}, "must be table or json"},
		{[]string{"fleet", "report"}, "ledger"},
		{[]string{"fleet", "status", "--targets", open, "--dsn", "postgres://x@h/d"}, "not --dsn"},
	} {
		if r := clitest.Run(t, nil, c.args...); r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%v: exit %d, want 2 with %q:\n%s", c.args, r.Code, c.want, r.Stderr)
		}
	}
}

// TestFleetTargetTimeout: a target that outlives --target-timeout is a row
// "did not finish" with exit 4, not an interrupt of the fleet.
func TestFleetTargetTimeout(t *testing.T) {
	db := testdb.Baseline(t)
	r := clitest.Run(t, nil, "fleet", "audit", "--targets", writeTargets(t, "slow "+db.DSN), "--target-timeout", "1ms", "--format", "json")
	e := entry(t, report(t, r), "slow")
	if r.Code != cli.ExitInconclusive || !strings.Contains(e["cause"].(string), "--target-timeout 1ms") {
		t.Errorf("exit %d, %v\n%s", r.Code, e, r.Stderr)
	}
	if !strings.Contains(r.Stderr, "fleet audit [1/1] slow") {
		t.Errorf("no progress line on stderr:\n%s", r.Stderr)
	}
}
