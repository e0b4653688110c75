package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// The one JSON path prints a run's document exactly as a struct with the
// envelope and the report embedded does: the same members, order and
// indentation.
func TestWriteCommandJSON(t *testing.T) {
	rr := &online.RollbackReport{PhaseFound: "backfill", Locks: []online.LockWindow{{Step: "rollback", Attempts: 2, WindowMS: 3}}}
	res := &outcome.Result[*online.RollbackReport]{Outcome: outcome.RolledBack, Message: "undone <&>", Report: rr}
	var got, want bytes.Buffer
	if err := writeCommandJSON(&got, "apply --rollback-online", "postgres@h:5432/db", ExitOK, res); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(&want, struct {
		Command    string              `json:"command"`
		Database   string              `json:"database"`
		ExitCode   int                 `json:"exit_code"`
		Outcome    outcome.Outcome     `json:"outcome"`
		Message    string              `json:"message"`
		PhaseFound online.Phase        `json:"phase_found"`
		Locks      []online.LockWindow `json:"locks"`
	}{"apply --rollback-online", "postgres@h:5432/db", ExitOK, res.Outcome, res.Message, rr.PhaseFound, rr.Locks}); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Fatalf("got\n%s\nwant\n%s", got.String(), want.String())
	}
}

// One exit-code map for every run, from its outcome and error.
func TestRunExitCode(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(live)
	cancel()
	cause := errors.New("cause")
	for _, c := range []struct {
		ctx     context.Context
		outcome outcome.Outcome
		err     error
		want    int
	}{
		{live, outcome.Applied, nil, ExitOK},
		{live, outcome.AlreadyApplied, nil, ExitOK},
		{live, outcome.NothingToDo, nil, ExitOK},
		{live, outcome.Refused, cause, ExitFindings},
		{live, outcome.LockBusy, cause, ExitFindings},
		{live, outcome.Failed, cause, ExitFindings},
		{live, outcome.Inconclusive, cause, ExitInconclusive},
		{live, outcome.Interrupted, cause, ExitInterrupted},
		{cancelled, outcome.Failed, cause, ExitInterrupted},
		{live, outcome.Failed, &session.LostError{Err: cause}, ExitEnvironment},
		{live, outcome.Failed, fmt.Errorf("switch: %w", &session.LostError{Err: cause}), ExitEnvironment},
		{live, outcome.Inconclusive, &envError{cause: "statement_timeout", err: cause}, ExitEnvironment},
	} {
		if got := runExitCode(c.ctx, c.outcome, c.err); got != c.want {
			t.Errorf("%s, %v (ctx %v): exit %d, want %d", c.outcome, c.err, c.ctx.Err(), got, c.want)
		}
	}
}
