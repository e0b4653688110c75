package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
)

// TestOnlineOutputNamesPassAndPreflight: an online run stopped in its first
// backfill pass says "pass 1, not finished", as status numbers the pass
// (before: "0 passes" beside status's "pass 1"); the preflight, which runs
// outside the phases (phase "none"), is labelled preflight, in the table
// and in the progress (before: "- none: preflight: ..." and "none done in").
func TestOnlineOutputNamesPassAndPreflight(t *testing.T) {
	rep := &online.Report{StartPhase: online.PhaseBackfill, Backfill: online.BackfillStats{Rows: 500, Batches: 5, Pass: 1},
		Phases: []online.PhaseTiming{{Phase: online.PhaseNone, DurationMS: 12, Detail: "preflight: the shared check catalog, exact, no table locks"}}}
	var out bytes.Buffer
	if err := writeOnlineTable(&out, "db", &outcome.Result[*online.Report]{Outcome: outcome.Interrupted, Message: "interrupted", Report: rep}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "(pass 1, not finished,") || strings.Contains(text, "0 passes") {
		t.Errorf("the backfill line of a run stopped in pass 1:\n%s", text)
	}
	if strings.Contains(text, "│ none ") || !strings.Contains(text, "│ preflight ") {
		t.Errorf("the phases table labels the preflight:\n%s", text)
	}
	rep.Backfill.Passes = 1
	if out.Reset(); writeOnlineTable(&out, "db", &outcome.Result[*online.Report]{Report: rep}) != nil || !strings.Contains(out.String(), "(pass 1, finished,") {
		t.Errorf("a finished pass:\n%s", out.String())
	}

	var progress bytes.Buffer
	a := &App{Stderr: &progress, Interactive: true}
	ev, stop := a.onlineProgress()
	ev(online.Event{Phase: online.PhaseNone, Detail: "preflight: the shared check catalog"})
	ev(online.Event{Phase: online.PhaseNone, Detail: "preflight: the shared check catalog", Done: true})
	ev(online.Event{Phase: online.PhaseNone, Detail: "expand: busy (lock timeout), attempt 1 of 6, retrying in 200ms"})
	// The switch's own steps end under their names, the switch under its.
	ev(online.Event{Phase: online.PhaseSwitch, Detail: "integrity: embedded migrations against atlas.sum", Done: true})
	ev(online.Event{Phase: online.PhaseSwitch, Detail: "fence and function switch in one short transaction (upgrade.Apply), preflight under its locks", Done: true})
	stop()
	if p := progress.String(); !strings.Contains(p, "  switch: integrity done in") || !strings.Contains(p, "\n  switch done in") {
		t.Errorf("the switch's steps:\n%s", p)
	}
	if p := progress.String(); strings.Contains(p, "none") || !strings.Contains(p, "- preflight: the shared check catalog\n") ||
		!strings.Contains(p, "  preflight done in") || !strings.Contains(p, "- expand: busy") {
		t.Errorf("progress:\n%s", p)
	}
}
