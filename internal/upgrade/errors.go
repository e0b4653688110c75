package upgrade

import (
	"context"
	"errors"
)

// Error is how Apply fails: the outcome travels with the cause, so a caller
// decides (exit code, retry, message) from the error alone.
//
//	var ae *upgrade.Error
//	if errors.As(err, &ae) && ae.Outcome == upgrade.OutcomeLockBusy { ... }
//	errors.Is(err, upgrade.ErrPreflight)       // the sentinel causes stay reachable
//	errors.Is(err, &upgrade.Error{Outcome: upgrade.OutcomeRefused}) // by outcome
type Error struct {
	Outcome Outcome
	Err     error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Is matches another *Error by outcome (an empty target outcome matches any).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && (t.Outcome == "" || t.Outcome == e.Outcome)
}

// OutcomeOf is the outcome an error of Apply (or of apply --online) carries:
// "" for nil, OutcomeInterrupted for a cancelled context, OutcomeFailed for
// an error without an outcome.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Outcome
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return OutcomeInterrupted
	}
	return OutcomeFailed
}

// fail wraps err with an outcome, keeping an outcome already attached.
func fail(o Outcome, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Outcome: o, Err: err}
}

// unwrapOutcome strips an outer *Error (its outcome is re-attached by Apply).
func unwrapOutcome(err error) error {
	if e, ok := err.(*Error); ok {
		return e.Err
	}
	return err
}
