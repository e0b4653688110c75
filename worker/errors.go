package worker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrProtocolMismatch is matched (errors.Is) by every *ProtocolMismatchError:
// the database does not speak pgflow 0.17's worker protocol (a pgflow 0.16.0
// database that has not been upgraded, or no pgflow at all).
var ErrProtocolMismatch = errors.New("pgflow worker protocol mismatch")

// ErrFlowMismatch is matched (errors.Is) by every *FlowShapeMismatchError
// and *FlowRoutingMismatchError.
var ErrFlowMismatch = errors.New("flow does not match the database")

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = errors.New("invalid worker configuration")

// ErrStopped is returned by Start on a worker that was started before: a
// Worker runs once.
var ErrStopped = errors.New("worker already started")

// ProtocolMismatchError says the database lacks the 0.17 calls. Start returns
// it from its first call (ensure_flow_compiled with four arguments), before
// the worker has tracked its function or registered.
type ProtocolMismatchError struct {
	// Missing lists the functions of the protocol the database lacks.
	Missing []string
	// Err is the database error that revealed the mismatch (a *pgconn.PgError
	// with SQLSTATE 42883 or 3F000), if any.
	Err error
}

func (e *ProtocolMismatchError) Error() string {
	var b strings.Builder
	b.WriteString("pgflow worker protocol mismatch: the database does not speak pgflow 0.17's worker protocol")
	if len(e.Missing) > 0 {
		fmt.Fprintf(&b, " (missing %s)", strings.Join(e.Missing, ", "))
	}
	b.WriteString("; is it still pgflow 0.16.0? upgrade it first (`pgflow-upgrade status`, then `pgflow-upgrade apply`)")
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrProtocolMismatch) true.
func (e *ProtocolMismatchError) Is(target error) bool { return target == ErrProtocolMismatch }

// Unwrap keeps the database error reachable (errors.As to *pgconn.PgError).
func (e *ProtocolMismatchError) Unwrap() error { return e.Err }

// FlowShapeMismatchError: ensure_flow_compiled found the flow with a
// different shape (steps, dependencies, options) than the worker's, on a
// database where it does not recompile. Nothing was registered.
type FlowShapeMismatchError struct {
	FlowSlug    string
	Differences []string
}

func (e *FlowShapeMismatchError) Error() string {
	return fmt.Sprintf("flow %q: shape does not match the database: %s (deploy the matching flow definition, or migrate the flow)",
		e.FlowSlug, strings.Join(e.Differences, "; "))
}

// Is makes errors.Is(err, ErrFlowMismatch) true.
func (e *FlowShapeMismatchError) Is(target error) bool { return target == ErrFlowMismatch }

// FlowRoutingMismatchError: the flow's shape matches but its routing does
// not (its stored queue_mode, or the step → queue list). Nothing was
// registered.
type FlowRoutingMismatchError struct {
	FlowSlug    string
	Differences []string
}

func (e *FlowRoutingMismatchError) Error() string {
	return fmt.Sprintf("flow %q: routing (queue mode or step queues) does not match the database: %s (run the flow in its stored queue mode)",
		e.FlowSlug, strings.Join(e.Differences, "; "))
}

// Is makes errors.Is(err, ErrFlowMismatch) true.
func (e *FlowRoutingMismatchError) Is(target error) bool { return target == ErrFlowMismatch }

// ConfigError is a problem with a Config (or a Flow definition, its routes
// included) found before anything touched the database.
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
// does not exist: what a 0.16.0 (or non-pgflow) database answers to the 0.17
// calls.
func isUndefined(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "42883", // undefined_function
		"3F000", // invalid_schema_name
		"42P01", // undefined_table
		"42704": // undefined_object
		return true
	}
	return false
}
