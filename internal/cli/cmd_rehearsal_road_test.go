package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// captureUpstream builds upstream's release (its own files) with runs,
// tasks and messages in flight, and captures it with the command.
func captureUpstream(t *testing.T, release string) string {
	t.Helper()
	src := testdb.Upstream(t, release)
	if err := fixtures.LoadInflightRuns(context.Background(), src.Pool); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "upstream-"+release+".capture.gz")
	r := clitest.Run(t, map[string]string{}, "--dsn", src.DSN, "fixtures", "capture", "--out", file)
	if r.Code != cli.ExitOK {
		t.Fatalf("capture of upstream's %s: exit %d\n%s\n%s", release, r.Code, r.Stdout, r.Stderr)
	}
	return file
}

// A capture of upstream's 0.17.0 with work in flight: without
// --pgflow-migrations it cannot be rehearsed, every hop of its plan
// running upstream's files, and the replay refuses (exit 1, no scenario
// run, nothing passed), naming the files it needs and the flag; so it does
// with a copy lacking one. With the copy, the transactional apply's plan
// runs on the restored copy: rows and messages compared, the catalog
// upstream's newest (TestLongRehearsalOfUpstreamReleases runs every
// scenario, from more releases).
func TestRehearsalOfRelease(t *testing.T) {
	file := captureUpstream(t, versions.R0_17_0)
	all := versions.UpstreamFiles()
	r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", file)
	if r.Code != cli.ExitFindings || strings.Contains(r.Stdout, "passed") ||
		!strings.Contains(r.Stderr, "cannot rehearse the plan from pgflow 0.17.0") ||
		!strings.Contains(r.Stderr, "files 25-27") || !strings.Contains(r.Stderr, all[24].Name) || !strings.Contains(r.Stderr, all[26].Name) ||
		!strings.Contains(r.Stderr, "--pgflow-migrations DIR") {
		t.Fatalf("rehearsal of 0.17.0 without the files: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	// A copy lacking a file the plan needs is refused too, naming it.
	dir := testdb.PgflowInstalledCopy(t, 25)
	r = clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", file, "--pgflow-migrations", dir)
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stderr, all[25].Name) {
		t.Fatalf("rehearsal of 0.17.0 with a copy lacking file 26: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	dir = testdb.PgflowInstalledCopy(t, len(all))
	// --to as apply's: a capture already there has nothing to rehearse; a
	// release apply does not end at, or --to without --from, is usage.
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--from", file, "--pgflow-migrations", dir, "--to", versions.R0_17_0}, cli.ExitFindings, "already at or past 0.17.0"},
		{[]string{"--from", file, "--to", versions.R0_16_0}, cli.ExitUsage, "0.17.0 or later"},
		{[]string{"--to", versions.R0_17_1, "clean-upgrade"}, cli.ExitUsage, "--to needs --from"},
	} {
		r := clitest.Run(t, replayEnv(t), append([]string{"fixtures", "replay"}, c.args...)...)
		if r.Code != c.code || !strings.Contains(r.Stderr, c.says) || strings.Contains(r.Stdout, "passed") {
			t.Errorf("replay %v: exit %d, want %d saying %q\n%s", c.args, r.Code, c.code, c.says, r.Stderr)
		}
	}
	r = clitest.Run(t, replayEnv(t), "--format", "json", "fixtures", "replay", "--from", file, "--pgflow-migrations", dir, "capture-upgrade-survives")
	var rep struct {
		Scenarios []scenario.Result `json:"scenarios"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code != cli.ExitOK || len(rep.Scenarios) != 1 || !rep.Scenarios[0].Passed {
		t.Fatalf("rehearsal of 0.17.0 with the copy: exit %d, %v\n%s\n%s", r.Code, err, r.Stdout, r.Stderr)
	}
	notes := strings.Join(rep.Scenarios[0].Notes, "\n")
	if rows := rehearsedRows(t, rep.Scenarios[0]); rows == 0 || !strings.Contains(notes, "to upstream's own files 25-27 run in order") ||
		!strings.Contains(notes, "catalog exactly what upstream's files build at "+versions.Newest) {
		t.Fatalf("capture-upgrade-survives' notes:\n%s", notes)
	}
}

// rehearsedRows is the count of rows and messages the survival check
// compared, read from capture-upgrade-survives' note.
func rehearsedRows(t *testing.T, res scenario.Result) int {
	t.Helper()
	for _, n := range res.Notes {
		var rows int
		if _, err := fmt.Sscanf(n, "%d rows and messages identical", &rows); err == nil {
			return rows
		}
	}
	t.Fatalf("%s: no note of the rows compared: %q", res.Name, res.Notes)
	return 0
}

// Captures of upstream's 0.14.1, 0.17.0 and 0.17.1, each with work in
// flight, are rehearsed with the user's copy of upstream's files: apply's
// whole plan to upstream's newest runs on the restored copy (0.14.1: files
// 21-23, this tool's hop, 25-27; 0.17.1: the endpoint fix on the captured
// pgflow_telemetry schema), every row and message survives, verify
// passes, the catalog reached is exactly what upstream's files build at
// the newest release; the calibration says what it measured. With --to
// 0.17.0 the plan from 0.14.1 stops after this tool's own hop, its catalog
// exactly upstream's 0.17.0.
func TestLongRehearsalOfUpstreamReleases(t *testing.T) {
	testdb.SkipUnlessLong(t, "captures of upstream's 0.14.1, 0.17.0 and 0.17.1 with work in flight rehearsed to the newest release with the copy of upstream's files")
	dir := testdb.PgflowInstalledCopy(t, len(versions.UpstreamFiles()))
	for _, c := range []struct {
		release, to string // to: --to ("": upstream's newest)
		hops        int
	}{{versions.R0_14_1, "", 7}, {versions.R0_17_0, "", 3}, {versions.R0_17_1, "", 1}, {versions.R0_14_1, versions.R0_17_0, 4}} {
		name := c.release + "-to-newest"
		if c.to != "" {
			name = c.release + "-to-" + c.to
		}
		t.Run(name, func(t *testing.T) {
			file := captureUpstream(t, c.release)
			calib := filepath.Join(t.TempDir(), "calibration.json")
			args := []string{"--format", "json", "fixtures", "replay", "--from", file, "--pgflow-migrations", dir, "--calibration-out", calib}
			to := versions.Newest
			if c.to != "" {
				args, to = append(args, "--to", c.to), c.to
			}
			r := clitest.Run(t, replayEnv(t), args...)
			var rep struct {
				Scenarios []scenario.Result `json:"scenarios"`
				Passed    int               `json:"passed"`
				Failed    int               `json:"failed"`
				Rehearsal struct {
					LockWindowMS float64 `json:"lock_window_ms"`
					Plan         struct {
						FromFiles    int `json:"from_files"`
						ReachedFiles int `json:"reached_files"`
						Hops         []struct {
							Kind string `json:"kind"`
						} `json:"hops"`
					} `json:"plan"`
				} `json:"rehearsal"`
			}
			if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
				t.Fatalf("replay JSON: %v\n%s\n%s", err, r.Stdout, r.Stderr)
			}
			for _, s := range rep.Scenarios {
				t.Logf("%s passed=%t skipped=%t %.1fs %s %s", s.Name, s.Passed, s.Skipped, s.Seconds, strings.Join(s.Notes, "; "), s.Error)
			}
			if r.Code != cli.ExitOK || rep.Failed != 0 || rep.Passed == 0 {
				t.Fatalf("rehearsal of %s: exit %d, %d passed, %d failed\n%s", c.release, r.Code, rep.Passed, rep.Failed, r.Stderr)
			}
			rel, err := versions.LookupRelease(c.release)
			if err != nil {
				t.Fatal(err)
			}
			plan := fmt.Sprintf("%s -> %s in %d hop(s)", versions.StateName(rel.Files), to, c.hops)
			if !strings.Contains(r.Stderr, "rehearsing apply's plan: "+plan) {
				t.Errorf("stderr does not say the plan %q:\n%s", plan, r.Stderr)
			}
			var survives *scenario.Result
			for i := range rep.Scenarios {
				if rep.Scenarios[i].Name == "capture-upgrade-survives" {
					survives = &rep.Scenarios[i]
				}
			}
			if survives == nil || !survives.Passed {
				t.Fatalf("capture-upgrade-survives did not pass: %+v", survives)
			}
			notes := strings.Join(survives.Notes, "\n")
			if rows := rehearsedRows(t, *survives); rows == 0 {
				t.Errorf("the survival check compared no rows and messages")
			}
			if !strings.Contains(notes, "catalog exactly what upstream's files build at "+to) || !strings.Contains(notes, "plan: "+plan) {
				t.Errorf("capture-upgrade-survives' notes do not show the plan and the catalog reached:\n%s", notes)
			}
			if rep.Rehearsal.LockWindowMS <= 0 {
				t.Errorf("no lock window measured: %+v", rep.Rehearsal)
			}
			toRel, err := versions.LookupRelease(to)
			if err != nil {
				t.Fatal(err)
			}
			if p := rep.Rehearsal.Plan; p.FromFiles != rel.Files || p.ReachedFiles != toRel.Files || len(p.Hops) != c.hops {
				t.Errorf("the JSON's rehearsal.plan: %+v, want %d -> %d in %d hops", p, rel.Files, toRel.Files, c.hops)
			}
			cal, err := forecast.ReadCalibration(calib)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(cal.Source, "the whole plan's") || !strings.Contains(cal.Source, plan) {
				t.Errorf("calibration source %q does not say it measured the whole plan", cal.Source)
			}
		})
	}
}
