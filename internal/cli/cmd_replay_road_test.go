package cli_test

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// roadNames are the scenarios that need --pgflow-migrations.
var roadNames = []string{"road-0.14.1-to-newest", "road-0.17.0-to-newest", "road-telemetry-off", "road-missing-file"}

// roadJUnit is what the road tests read of a JUnit file.
type roadJUnit struct {
	Suites []struct {
		Failures int `xml:"failures,attr"`
		Skipped  int `xml:"skipped,attr"`
		Cases    []struct {
			Name    string `xml:"name,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func readRoadJUnit(t *testing.T, path string, cases int) roadJUnit {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc roadJUnit
	if err := xml.Unmarshal(b, &doc); err != nil || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != cases {
		t.Fatalf("JUnit file: %v\n%s", err, b)
	}
	return doc
}

// The road scenarios on the vendored copy of upstream's files: each one
// passes (the missing-file one by apply's refusal), JSON and JUnit agree.
func TestReplayRoadScenarios(t *testing.T) {
	testdb.SkipIfShort(t, "the four road scenarios build databases from upstream's files and apply them to the newest")
	dir := filepath.Join(testdb.PgflowMigrationsDir(t), "migrations")
	junit := filepath.Join(t.TempDir(), "junit.xml")
	args := append([]string{"--format", "json", "fixtures", "replay", "--pgflow-migrations", dir, "--junit", junit}, roadNames...)
	r := clitest.Run(t, replayEnv(t), args...)
	var rep struct {
		Scenarios []scenario.Result `json:"scenarios"`
		Passed    int               `json:"passed"`
		Failed    int               `json:"failed"`
		Skipped   int               `json:"skipped"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("replay JSON: %v\n%s\n%s", err, r.Stdout, r.Stderr)
	}
	for _, s := range rep.Scenarios {
		t.Logf("%s passed=%t %.1fs %s %s", s.Name, s.Passed, s.Seconds, strings.Join(s.Notes, "; "), s.Error)
	}
	if r.Code != cli.ExitOK || rep.Passed != len(roadNames) || rep.Failed != 0 || rep.Skipped != 0 {
		t.Fatalf("replay: exit %d, %d passed, %d failed, %d skipped\n%s", r.Code, rep.Passed, rep.Failed, rep.Skipped, r.Stderr)
	}
	// The log says what the databases were built from and on.
	if !strings.Contains(r.Stderr, "upstream's first 20 files (0.14.1) from "+dir) || !strings.Contains(r.Stderr, "pg_cron stand-in") {
		t.Errorf("stderr does not say what the upstream templates were built from:\n%s", r.Stderr)
	}
	doc := readRoadJUnit(t, junit, len(roadNames))
	if s := doc.Suites[0]; s.Failures != 0 || s.Skipped != 0 {
		t.Fatalf("JUnit: %d failures, %d skipped", s.Failures, s.Skipped)
	}
	for _, s := range rep.Scenarios {
		if s.Name == "road-missing-file" && !strings.Contains(strings.Join(s.Notes, "\n"), "h1:") {
			t.Errorf("road-missing-file's notes do not show the refusal with the hash: %q", s.Notes)
		}
	}
}

// With a copy lacking upstream's file 25, the road to the newest fails
// (exit 1) naming the file: the scenario's pass is not a given.
func TestReplayRoadFailsOnIncompleteCopy(t *testing.T) {
	testdb.SkipIfShort(t, "a road scenario on a copy lacking a file fails, naming it")
	dir := testdb.PgflowInstalledCopy(t, len(versions.UpstreamFiles()))
	gone := versions.UpstreamFiles()[24]
	if err := os.Remove(filepath.Join(dir, testdb.InstalledName(24, gone.Name))); err != nil {
		t.Fatal(err)
	}
	r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--pgflow-migrations", dir, "road-0.17.0-to-newest")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "FAIL") || !strings.Contains(r.Stderr, gone.Name) ||
		!strings.Contains(r.Stderr, "h1:"+gone.Hash) || !strings.Contains(r.Stdout, "0 passed, 1 failed") {
		t.Fatalf("replay on an incomplete copy: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
}

// Without --pgflow-migrations the road scenarios are not run and say why:
// SKIP in the table and the summary, <skipped/> in JUnit, never passed;
// the exit code is the other scenarios' (0 here).
func TestReplayRoadSkippedWithoutCopy(t *testing.T) {
	junit := filepath.Join(t.TempDir(), "junit.xml")
	r := clitest.Run(t, replayEnv(t), append([]string{"fixtures", "replay", "--junit", junit}, roadNames...)...)
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "0 passed, 0 failed, 4 skipped") {
		t.Fatalf("replay without the copy: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, n := range roadNames {
		if !strings.Contains(r.Stderr, "replay: SKIP "+n+": "+scenario.NeedsPgflowMigrations) {
			t.Errorf("stderr does not say %s was skipped and why:\n%s", n, r.Stderr)
		}
		line := ""
		for _, l := range strings.Split(r.Stdout, "\n") {
			if strings.Contains(l, n) {
				line = l
				break
			}
		}
		if !strings.Contains(line, "SKIP") || strings.Contains(line, "PASS") {
			t.Errorf("table line of %s is not SKIP: %q", n, line)
		}
	}
	if !strings.Contains(r.Stdout, "not run: needs --pgflow-migrations DIR") {
		t.Errorf("the table does not say why:\n%s", r.Stdout)
	}
	doc := readRoadJUnit(t, junit, len(roadNames))
	if s := doc.Suites[0]; s.Failures != 0 || s.Skipped != len(roadNames) {
		t.Fatalf("JUnit: %d failures, %d skipped, want 0 and %d", s.Failures, s.Skipped, len(roadNames))
	}
	for _, c := range doc.Suites[0].Cases {
		if c.Skipped == nil || c.Failure != nil || c.Skipped.Message != scenario.NeedsPgflowMigrations {
			t.Errorf("testcase %s: skipped %+v, failure %+v", c.Name, c.Skipped, c.Failure)
		}
	}
	// A folder holding none of upstream's files is a usage error.
	if r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--pgflow-migrations", t.TempDir(), "road-0.17.0-to-newest"); r.Code != cli.ExitUsage {
		t.Fatalf("--pgflow-migrations on an empty folder: exit %d\n%s", r.Code, r.Stderr)
	}
}
