// Package outcome is how every run reports how it ended. Every run that
// changes the database (upgrade.Apply, with or without --quiesce;
// online.Upgrade; online.Rollback; upgrade.UndoQuiesce) returns a *Result,
// never nil, and an error, by one rule: the error is nil exactly when the
// run did what it was asked, and the Result's Outcome then says which
// success it was (applied, already applied, dry run, rolled back, undone,
// nothing to do). Otherwise the error is the cause (its sentinels and
// *pgconn.PgError reachable with errors.Is and errors.As) and the Outcome
// says which kind of no: refused, lock busy, inconclusive, interrupted or
// failed. A refusal is an error like any failure; the outcome lives in
// Result.Outcome only, never in an error. A failure whose session is gone
// is a *session.LostError (Settle decides it).
//
// FromPreflight is the one mapping from a preflight that did not pass to
// an outcome, for apply and apply --online alike.
package outcome

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// Refusals of a preflight (exit 1): the database is unchanged.
var (
	ErrPreflight    = errors.New("the preflight refused the upgrade: nothing was changed")
	ErrInconclusive = errors.New("a preflight check ran out of time: nothing was changed")
)

// Outcome says how a run ended: the one place a run's outcome is kept
// (Result.Outcome).
type Outcome string

// Outcomes of a run that succeeded: it returns a nil error.
const (
	Applied        Outcome = "applied"
	AlreadyApplied Outcome = "already_applied"
	DryRun         Outcome = "dry_run"       // everything ran, then rolled back
	RolledBack     Outcome = "rolled_back"   // --rollback-online undid an unfinished online upgrade
	NothingToDo    Outcome = "nothing_to_do" // --rollback-online, --undo-quiesce: nothing to undo
	Undone         Outcome = "undone"        // --undo-quiesce restored every recorded value
)

// Outcomes of a run that did not do what it was asked: it returns the cause
// as its error. Each one changed nothing it was not meant to leave behind
// (the message says what remains).
const (
	Refused      Outcome = "refused"      // preflight, integrity, state or post-conditions said no
	LockBusy     Outcome = "lock_busy"    // the advisory lock or a table lock was not obtained
	Inconclusive Outcome = "inconclusive" // a preflight check ran out of time
	Interrupted  Outcome = "interrupted"  // context cancelled; rolled back
	Failed       Outcome = "failed"       // an error; rolled back
)

// Succeeded says whether o is the outcome of a run that did what it was
// asked (its error is nil).
func (o Outcome) Succeeded() bool {
	switch o {
	case Applied, AlreadyApplied, DryRun, RolledBack, NothingToDo, Undone:
		return true
	}
	return false
}

// Result is what one run did, whichever run it was: upgrade.Apply (with or
// without --quiesce, --resume-quiesce), online.Run, online.Rollback and
// upgrade.UndoQuiesce all return one, never nil, next to their error. Report is the
// run's own account (R: *upgrade.Report, *online.Report, ...).
//
// As JSON it is one object: outcome and message first, then the report's
// fields.
type Result[R any] struct {
	Outcome Outcome
	Message string
	Report  R
}

// Want is nil when the run ended with want; otherwise an error naming the
// outcome it had and its message. For callers that need one outcome, e.g.
// the upgrade applied by this run (a calibration, a benchmark), where an
// already upgraded database or a dry run, which succeed, will not do.
func (r *Result[R]) Want(want Outcome) error {
	if r.Outcome == want {
		return nil
	}
	return fmt.Errorf("outcome %s, want %s: %s", r.Outcome, want, r.Message)
}

// MarshalJSON writes outcome and message, then the report's fields, as one
// object.
func (r *Result[R]) MarshalJSON() ([]byte, error) {
	head, err := json.Marshal(struct {
		Outcome Outcome `json:"outcome"`
		Message string  `json:"message"`
	}{r.Outcome, r.Message})
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(r.Report)
	if err != nil {
		return nil, err
	}
	return MergeObjects(head, body)
}

// MergeObjects is the JSON object with a's members, then b's. b may be
// null (no members).
func MergeObjects(a, b []byte) ([]byte, error) {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		return a, nil
	}
	if len(a) < 2 || a[0] != '{' || len(b) < 2 || b[0] != '{' {
		return nil, fmt.Errorf("merging JSON objects: %.20q and %.20q are not both objects", a, b)
	}
	if string(b) == "{}" {
		return a, nil
	}
	if string(a) == "{}" {
		return b, nil
	}
	out := make([]byte, 0, len(a)+len(b))
	out = append(out, a[:len(a)-1]...)
	out = append(out, ',')
	return append(out, b[1:]...), nil
}

// Settle ends every run the same way. A nil err leaves res as the run wrote
// it. Otherwise the outcome is interrupted when ctx ended, the run's own
// when it set one that is not a success (refused, lock busy,
// inconclusive), failed else; the message is the error's unless the run
// wrote one; and a failure on a session that is gone is a
// *session.LostError, decided here, where the session is known.
func Settle[R any](ctx context.Context, conn *pgx.Conn, res *Result[R], err error) error {
	if err == nil {
		return nil
	}
	switch {
	case ctx.Err() != nil:
		res.Outcome = Interrupted
	case res.Outcome == "" || res.Outcome.Succeeded():
		res.Outcome = Failed
	}
	if res.Message == "" {
		res.Message = err.Error()
	}
	if res.Outcome == Failed {
		err = session.Lost(conn, err)
	}
	return err
}

// FromPreflight is the one mapping from a preflight that did not pass
// (res.OK() is false) to a run's outcome and error, for apply and apply
// --online alike: inconclusive (ErrInconclusive) when nothing blocks but a
// check could not answer, refused (ErrPreflight) otherwise.
func FromPreflight(res preflight.Result) (Outcome, error) {
	if len(res.Blockers()) == 0 && res.Inconclusive() {
		return Inconclusive, fmt.Errorf("%w: %s", ErrInconclusive, res.Summary())
	}
	return Refused, fmt.Errorf("%w: %s", ErrPreflight, res.Summary())
}
