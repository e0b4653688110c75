package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// The one JSON path prints a run's document exactly as a struct with the
// envelope and the report embedded does: the same members, order and
// indentation.
func TestWriteCommandJSON(t *testing.T) {
	rr := &online.RollbackReport{PhaseFound: "backfill", Locks: []online.LockWindow{{Step: "rollback", Attempts: 2, WindowMS: 3}}}
	res := &upgrade.Result[*online.RollbackReport]{Outcome: upgrade.OutcomeRolledBack, Message: "undone <&>", Report: rr}
	var got, want bytes.Buffer
	if err := writeCommandJSON(&got, "apply --rollback-online", "postgres@h:5432/db", ExitOK, res); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(&want, struct {
		Command    string              `json:"command"`
		Database   string              `json:"database"`
		ExitCode   int                 `json:"exit_code"`
		Outcome    upgrade.Outcome     `json:"outcome"`
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
		outcome upgrade.Outcome
		err     error
		want    int
	}{
		{live, upgrade.OutcomeApplied, nil, ExitOK},
		{live, upgrade.OutcomeAlreadyApplied, nil, ExitOK},
		{live, upgrade.OutcomeNothingToDo, nil, ExitOK},
		{live, upgrade.OutcomeRefused, cause, ExitFindings},
		{live, upgrade.OutcomeLockBusy, cause, ExitFindings},
		{live, upgrade.OutcomeFailed, cause, ExitFindings},
		{live, upgrade.OutcomeInconclusive, cause, ExitInconclusive},
		{live, upgrade.OutcomeInterrupted, cause, ExitInterrupted},
		{cancelled, upgrade.OutcomeFailed, cause, ExitInterrupted},
		{live, upgrade.OutcomeFailed, &session.LostError{Err: cause}, ExitEnvironment},
		{live, upgrade.OutcomeFailed, fmt.Errorf("switch: %w", &session.LostError{Err: cause}), ExitEnvironment},
		{live, upgrade.OutcomeInconclusive, &envError{cause: "statement_timeout", err: cause}, ExitEnvironment},
	} {
		if got := runExitCode(c.ctx, c.outcome, c.err); got != c.want {
			t.Errorf("%s, %v (ctx %v): exit %d, want %d", c.outcome, c.err, c.ctx.Err(), got, c.want)
		}
	}
}
