package upgrade

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Refusals for a database one of the tool's own multi-step runs left half
// done (exit 1, nothing changed): the version detection names both states,
// and apply refuses to start anything else on top of them.
var (
	// ErrOnlineInProgress: the transactional apply does not start from the
	// shape an unfinished apply --online left.
	ErrOnlineInProgress = errors.New("an online upgrade (pgflow-upgrade apply --online) is in progress on this database")
	// ErrQuiesceRecorded: an apply --quiesce was interrupted before its
	// restore; an apply that does not finish it would leave the worker
	// functions disabled and the cron jobs paused for good.
	ErrQuiesceRecorded = errors.New("an interrupted pgflow-upgrade apply --quiesce left its record open in pgflow_upgrade.quiesce")
)

// onlineRefusal: the refusal of a transactional apply on an unfinished
// online upgrade (nil when d names none).
func onlineRefusal(d *versions.Detection) error {
	if d == nil || d.Online == nil {
		return nil
	}
	return fmt.Errorf("%w (phase %s): apply without --online does not start from its shape; run `%s` to continue it, or `%s` to undo it (back to 0.16.0); nothing was changed",
		ErrOnlineInProgress, d.Online.Phase, d.Online.Continue, d.Online.Undo)
}

// quiesceRefusal: the refusal of an apply that would leave q open.
func quiesceRefusal(q *versions.Quiesce) error {
	return fmt.Errorf("%w %s, and an apply that does not finish it would leave them so; %s; nothing was changed",
		ErrQuiesceRecorded, quiesceHeld(q), quiesceCommands(q))
}

// quiesceHeld: q's phase and what it holds disabled and paused.
func quiesceHeld(q *versions.Quiesce) string {
	return fmt.Sprintf("(phase %s, since %s): the %d worker function(s) and %d cron job(s) it recorded are still disabled and paused",
		q.Phase, q.Since.UTC().Format(time.RFC3339), q.Functions, q.CronJobs)
}

// quiesceCommands: the two commands that close q.
func quiesceCommands(q *versions.Quiesce) string {
	return fmt.Sprintf("run `%s` to finish it (upgrade if not done, and restore), or `%s` to restore the recorded values without upgrading", q.Resume, q.Undo)
}

// CheckQuiesce is the gate of a run whose quiesce options are q (nil: no
// --quiesce), read before it changes anything: an open quiesce record is
// finished only by --resume-quiesce (or undone by --undo-quiesce), so any
// other run refuses; --resume-quiesce without a record refuses too. A
// refusal comes with outcome.Refused, a failure to read the record with
// outcome.Failed. A role that cannot read the record is not refused here
// (the version detection cannot see the record either).
func CheckQuiesce(ctx context.Context, qr Querier, q *quiesce.Options) (outcome.Outcome, error) {
	rec, _, err := quiesce.Find(ctx, qr)
	if err != nil {
		return outcome.Failed, err
	}
	switch {
	case rec == nil && q != nil && q.Resume:
		return outcome.Refused, quiesce.ErrNothing
	case rec == nil, q != nil && q.Resume:
		return "", nil
	case q == nil:
		return outcome.Refused, quiesceRefusal(versions.NewQuiesce(rec))
	}
	return outcome.Refused, fmt.Errorf("%w (phase %s, since %s): finish it with `%s` or undo it with `%s`",
		quiesce.ErrInProgress, rec.Phase, rec.StartedAt.UTC().Format(time.RFC3339), quiesce.ResumeCommand(rec.Mode), quiesce.UndoCommand)
}
