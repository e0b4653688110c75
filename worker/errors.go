package worker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrProtocolMismatch is matched (errors.Is) by every *ProtocolMismatchError:
// the database does not speak the queue-aware worker protocol (it is a
// pgflow 0.16.0 database that has not been upgraded, or not pgflow at all).
var ErrProtocolMismatch = errors.New("pgflow worker protocol mismatch")

// ErrFlowMismatch is matched (errors.Is) by every *FlowMismatchError.
var ErrFlowMismatch = errors.New("flow shape does not match the database")

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = errors.New("invalid worker configuration")

// ErrStopped is returned by Start on a worker that was started before: a
// Worker runs once.
var ErrStopped = errors.New("worker already started")

// ProtocolMismatchError says why the startup fence refused the database. It is
// returned before the worker has written anything.
type ProtocolMismatchError struct {
	// Want is the protocol version this package speaks.
	Want int
	// Got is the version the database reported, or 0 when it has no marker.
	Got int
	// Missing lists the functions of the protocol the database lacks.
	Missing []string
	// Err is the database error that revealed the mismatch (a *pgconn.PgError
	// with SQLSTATE 42883 or 3F000), if any.
	Err error
}

func (e *ProtocolMismatchError) Error() string {
	var b strings.Builder
	b.WriteString("pgflow worker protocol mismatch: ")
	switch {
	case e.Got == 0:
		fmt.Fprintf(&b, "the database has no queue protocol marker (pgflow.queue_protocol_version()), want version %d", e.Want)
	case e.Got != e.Want:
		fmt.Fprintf(&b, "the database speaks version %d, want %d", e.Got, e.Want)
	default:
		fmt.Fprintf(&b, "version %d", e.Got)
	}
	if len(e.Missing) > 0 {
		fmt.Fprintf(&b, "; missing %s", strings.Join(e.Missing, ", "))
	}
	b.WriteString(" (is the database upgraded? run `pgflow-upgrade status`)")
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrProtocolMismatch) true.
func (e *ProtocolMismatchError) Is(target error) bool { return target == ErrProtocolMismatch }

// Unwrap keeps the database error reachable (errors.As to *pgconn.PgError).
func (e *ProtocolMismatchError) Unwrap() error { return e.Err }

// FlowMismatchError is returned when ensure_flow_compiled reports that the
// flow in the database has a different shape than the worker's.
type FlowMismatchError struct {
	FlowSlug    string
	Differences []string
}

func (e *FlowMismatchError) Error() string {
	return fmt.Sprintf("flow %q: shape does not match the database: %s",
		e.FlowSlug, strings.Join(e.Differences, "; "))
}

// Is makes errors.Is(err, ErrFlowMismatch) true.
func (e *FlowMismatchError) Is(target error) bool { return target == ErrFlowMismatch }

// ConfigError is a problem with a Config (or a Flow definition) found before
// anything touched the database.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid worker configuration: %s: %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// isUndefined reports whether err is the database saying a function or schema
// does not exist: what a 0.16.0 (or non-pgflow) database answers to the new
// protocol's calls.
func isUndefined(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "42883", // undefined_function
		"3F000", // invalid_schema_name
		"42P01", // undefined_table (e.g. a missing type or relation in the protocol)
		"42704": // undefined_object
		return true
	}
	return false
}
