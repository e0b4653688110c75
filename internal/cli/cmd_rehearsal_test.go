package cli_test

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

type junitDoc struct {
	Suites []struct {
		Cases []struct {
			Name       string `xml:"name,attr"`
			Properties []struct {
				Name  string `xml:"name,attr"`
				Value string `xml:"value,attr"`
			} `xml:"properties>property"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func readJUnit(t *testing.T, path string) junitDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc junitDoc
	if err := xml.Unmarshal(b, &doc); err != nil || len(doc.Suites) != 1 {
		t.Fatalf("JUnit file: %v\n%s", err, b)
	}
	return doc
}

// The rehearsal through the command: a capture with a second schema
// (--include-schema) replayed with generous budgets passes, reports both
// figures (JSON, JUnit properties) and writes a calibration the forecast
// reads; a tiny --max-lock-window fails that case (exit 1, JUnit failure),
// the case named after the capture.
func TestRehearsalBudgetsAndCalibration(t *testing.T) {
	testdb.SkipIfShort(t, "The rehearsal through the command")
	t.Parallel() // long and self-contained: overlaps the package's other long tests
	ctx := context.Background()
	db := testdb.Baseline(t)
	if _, err := scenario.Generate(ctx, db.Pool, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `create schema app;
		create table app.notes (id bigint generated always as identity primary key, flow_slug text references pgflow.flows (flow_slug));
		insert into app.notes (flow_slug) select flow_slug from pgflow.flows`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "prod.capture.gz")
	r := clitest.Run(t, map[string]string{}, "--format", "json", "--dsn", db.DSN, "fixtures", "capture", "--out", file, "--include-schema", "app")
	if r.Code != 0 || !strings.Contains(r.Stdout, `"app"`) {
		t.Fatalf("capture: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	r = clitest.Run(t, map[string]string{}, "--dsn", db.DSN, "fixtures", "capture", "--out", filepath.Join(dir, "x.gz"), "--include-schema", "nope")
	if r.Code != 1 || !strings.Contains(r.Stderr, "no such schema") {
		t.Fatalf("capture of a missing schema: exit %d\n%s", r.Code, r.Stderr)
	}

	junit := filepath.Join(dir, "junit.xml")
	calib := filepath.Join(dir, "calibration.json")
	r = clitest.Run(t, replayEnv(t), "--format", "json", "fixtures", "replay", "--from", file, "--junit", junit,
		"--max-lock-window", "1h", "--max-wait", "1h", "--calibration-out", calib)
	var rep struct {
		Failed    int `json:"failed"`
		Rehearsal struct {
			LockWindowMS        float64 `json:"lock_window_ms"`
			MaxLockWindowMS     float64 `json:"max_lock_window_ms"`
			OnlineLongestWaitMS float64 `json:"online_longest_wait_ms"`
			StepTasks           int64   `json:"step_tasks"`
		} `json:"rehearsal"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code != 0 || rep.Failed != 0 {
		t.Fatalf("replay with generous budgets: exit %d, %v\n%s\n%s", r.Code, err, r.Stdout, r.Stderr)
	}
	if rep.Rehearsal.MaxLockWindowMS != 3600000 || rep.Rehearsal.OnlineLongestWaitMS <= 0 || rep.Rehearsal.StepTasks <= 0 {
		t.Errorf("rehearsal figures: %+v", rep.Rehearsal)
	}
	doc := readJUnit(t, junit)
	props := map[string]bool{}
	for _, c := range doc.Suites[0].Cases {
		if !strings.HasSuffix(c.Name, "[prod.capture.gz]") {
			t.Errorf("JUnit case %q does not name the capture", c.Name)
		}
		for _, p := range c.Properties {
			props[p.Name] = true
		}
	}
	for _, p := range []string{"lock_window_ms", "lock_window_budget_ms", "online_longest_wait_ms", "online_longest_wait_budget_ms"} {
		if !props[p] {
			t.Errorf("JUnit has no property %s (%v)", p, props)
		}
	}
	cal, err := forecast.ReadCalibration(calib)
	if err != nil && !strings.Contains(err.Error(), "no measured lock window") {
		t.Fatal(err)
	}
	if cal.StepTasks != rep.Rehearsal.StepTasks || cal.OnlineLongestWaitMS <= 0 || !strings.Contains(cal.Source, "prod.capture.gz") {
		t.Errorf("calibration %+v", cal)
	}

	r = clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", file, "--junit", junit, "--max-lock-window", "1ns", "capture-upgrade-survives")
	if r.Code != 1 || !strings.Contains(r.Stdout, "EXCEEDED") {
		t.Fatalf("replay with a 1ns lock window budget: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	doc = readJUnit(t, junit)
	if c := doc.Suites[0].Cases; len(c) != 1 || c[0].Failure == nil || !strings.Contains(c[0].Failure.Message, "exceeds the budget") {
		t.Fatalf("JUnit of the over-budget run: %+v", c)
	}

	r = clitest.Run(t, replayEnv(t), "fixtures", "replay", "--max-wait", "1s", "clean-upgrade")
	if r.Code != 2 || !strings.Contains(r.Stderr, "needs --from") {
		t.Fatalf("a budget without --from: exit %d\n%s", r.Code, r.Stderr)
	}
}
