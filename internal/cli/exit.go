package cli

import (
	"context"
	"errors"
	"fmt"
)

// Exit codes, the same for every command (README "Exit codes").
const (
	ExitOK           = 0   // success, nothing to report
	ExitFindings     = 1   // blockers found, or the command refused to act
	ExitUsage        = 2   // bad flags or arguments
	ExitEnvironment  = 3   // cannot connect, or the environment lacks something
	ExitInconclusive = 4   // a check ran out of time (or errored): not proven
	ExitInterrupted  = 130 // SIGINT / SIGTERM
)

// ExitError carries an exit code with the error that caused it.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// withCode wraps err with an exit code; nil stays nil.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: code, Err: err}
}

func usageErrorf(format string, args ...any) error {
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf(format, args...)}
}

// exitCode maps an error returned by a command to its exit code.
func exitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	if errors.Is(err, context.Canceled) {
		return ExitInterrupted
	}
	return ExitFindings
}
