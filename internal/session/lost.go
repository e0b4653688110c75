package session

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// LostError is the error of work whose session ended under it (the server
// terminated it, the network dropped it): the server rolled back whatever
// transaction was open. Err is what the work saw; its text is Err's.
type LostError struct{ Err error }

func (e *LostError) Error() string { return e.Err.Error() }
func (e *LostError) Unwrap() error { return e.Err }

// Lost is err, as a *LostError when conn's session is gone. The code that
// used conn decides it, so that its callers read the fact from the error
// instead of looking at a connection they may not have.
func Lost(conn *pgx.Conn, err error) error {
	var lost *LostError
	if err == nil || !conn.IsClosed() || errors.As(err, &lost) {
		return err
	}
	return &LostError{Err: err}
}
