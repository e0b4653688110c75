package cli_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func replayEnv(t *testing.T) map[string]string {
	return map[string]string{"PGFLOW_UPGRADE_NO_DOCKER": "1", "PGFLOW_UPGRADE_DSN": testdb.Server(t).AdminDSN()}
}

func TestReplayUnknownScenarioIsUsage(t *testing.T) {
	r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "no-such-scenario")
	if r.Code != 2 || !strings.Contains(r.Stderr, "clean-upgrade") {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
}

func TestReplayDamagedOrForeignFile(t *testing.T) {
	dir := t.TempDir()
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return b.Bytes()
	}
	cases := []struct {
		name string
		data []byte
		code int
		want string
	}{
		{"dump.sql", []byte("-- PostgreSQL database dump\n"), 2, "not gzip"},
		{"foreign.gz", gz(`{"hello": 1}` + "\n"), 2, "format"},
		{"truncated.gz", gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline"}` + "\n"), 2, "truncated"},
		{"upgraded.gz", gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "upgraded"}` + "\n" + `{"end": {"records": 0}}` + "\n"), 1, "not a pgflow 0.16.0 baseline"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.name)
		if err := os.WriteFile(p, c.data, 0o600); err != nil {
			t.Fatal(err)
		}
		r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", p)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%s: exit %d (want %d), stderr %q (want %q)", c.name, r.Code, c.code, r.Stderr, c.want)
		}
	}
	r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", filepath.Join(dir, "missing.gz"))
	if r.Code != 2 {
		t.Errorf("missing file: exit %d, %s", r.Code, r.Stderr)
	}
}

func TestCaptureNeedsADatabase(t *testing.T) {
	r := clitest.Run(t, map[string]string{}, "fixtures", "capture", "--out", filepath.Join(t.TempDir(), "x.gz"))
	if r.Code != 2 {
		t.Fatalf("exit %d: %s", r.Code, r.Stderr)
	}
	db := testdb.Empty(t)
	out := filepath.Join(t.TempDir(), "x.gz")
	r = clitest.Run(t, map[string]string{}, "fixtures", "capture", "--dsn", db.DSN, "--out", out)
	if r.Code != 1 {
		t.Fatalf("capture of an empty database: exit %d: %s", r.Code, r.Stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused capture left a file: %v", err)
	}
}

// capture → replay --from, JSON and JUnit output.
func TestCaptureThenReplay(t *testing.T) {
	testdb.SkipIfShort(t, "capture → replay --from, JSON and JUnit output")
	db := testdb.Baseline(t)
	if _, err := scenario.Generate(context.Background(), db.Pool, 5); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "state.jsonl.gz")
	r := clitest.Run(t, map[string]string{}, "--dsn", db.DSN, "fixtures", "capture", "--out", file, "--redact")
	if r.Code != 0 || !strings.Contains(r.Stdout, "(redacted)") {
		t.Fatalf("capture: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	junit := filepath.Join(dir, "junit.xml")
	r = clitest.Run(t, replayEnv(t), "--format", "json", "fixtures", "replay", "--from", file, "--junit", junit)
	var rep struct {
		Scenarios []scenario.Result `json:"scenarios"`
		Failed    int               `json:"failed"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("replay JSON: %v\n%s\n%s", err, r.Stdout, r.Stderr)
	}
	if len(rep.Scenarios) != len(rehearsal.CaptureScenarios()) {
		t.Fatalf("replayed %d scenarios, want %d", len(rep.Scenarios), len(rehearsal.CaptureScenarios()))
	}
	if r.Code != 0 || rep.Failed != 0 {
		t.Fatalf("replay of a clean capture: exit %d, %d failed:\n%s", r.Code, rep.Failed, r.Stderr)
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Cases []struct {
				Name string `xml:"name,attr"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != len(rep.Scenarios) {
		t.Fatalf("JUnit file: %v\n%s", err, b)
	}
}

// Built-in scenarios by name through the command: the table names each with
// PASS, and --junit writes one testcase per scenario, none failed.
func TestReplayBuiltinTableAndJUnit(t *testing.T) {
	testdb.SkipIfShort(t, "Built-in scenarios by name through the command")
	junit := filepath.Join(t.TempDir(), "junit.xml")
	names := []string{"realtime-events", "malformed-duplicate-message-id", "old-worker-after-upgrade"}
	r := clitest.Run(t, replayEnv(t), append([]string{"fixtures", "replay", "--junit", junit}, names...)...)
	if r.Code != 0 {
		t.Fatalf("replay: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, n := range names {
		line := ""
		for _, l := range strings.Split(r.Stdout, "\n") {
			if strings.Contains(l, n) {
				line = l
				break
			}
		}
		if !strings.Contains(line, "PASS") {
			t.Errorf("table has no PASS line for %s:\n%s", n, r.Stdout)
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != len(names) {
		t.Fatalf("JUnit file: %v\n%s", err, b)
	}
	for i, c := range doc.Suites[0].Cases {
		if c.Name != names[i] || c.Failure != nil {
			t.Errorf("testcase %d: %q failed=%t, want %q passed", i, c.Name, c.Failure != nil, names[i])
		}
	}
}
