package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// What a failure means for the operator: what happened, whether anything
// changed, and what to do. Every command's error goes through
// explainFailure (from diagnose for the runs that change the database,
// from Run for the others), so a lost server, a full disk or a server
// timeout read the same wherever they happen. The causes named here need no
// connection to the server; those that do (where a setting comes from)
// are read by diagnose (envcheck.go).

// explainFailure is err explained as an environment failure (exit 3), or
// nil when err is something else (a refusal, a bug, an interruption).
// command is what ran ("apply", "apply --online", "audit", ...).
func explainFailure(err error, command string) *envError {
	if err == nil {
		return nil
	}
	var env *envError
	if errors.As(err, &env) {
		return env
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if e := explainSQLState(pgErr, command); e != nil {
			e.err = err
			return e
		}
		return nil
	}
	if connectionGone(err) {
		return &envError{err: err,
			cause: "the connection to the server was lost (the server went away: a crash, a restart, a failover, " +
				"a terminated session or a network failure)",
			hint:  "check that the server is back (pg_isready, or `pgflow-upgrade status`)",
			rerun: "then run " + command + " again: it starts over", lost: true}
	}
	return nil
}

// explainSQLState explains the SQLSTATEs of the environment that need no
// further reading.
func explainSQLState(pgErr *pgconn.PgError, command string) *envError {
	rerun := "then run " + command + " again: it starts over"
	switch pgErr.Code {
	case "57P01": // admin_shutdown
		return &envError{cause: "the server ended the session: it is shutting down, or an administrator terminated the session (pg_terminate_backend)",
			hint: "check that the server is up (pg_isready, or `pgflow-upgrade status`) and that nobody terminates the tool's sessions", rerun: rerun, lost: true}
	case "57P02": // crash_shutdown
		return &envError{cause: "the server crashed (another server process failed and PostgreSQL ended every session to recover)",
			hint: "wait until the server has recovered (pg_isready, or `pgflow-upgrade status`) and look at the server log for the process that failed", rerun: rerun, lost: true}
	case "57P03": // cannot_connect_now
		return &envError{cause: "the server is not accepting sessions yet: it is starting up, recovering from a crash, or shutting down",
			hint: "wait until it accepts connections (pg_isready, or `pgflow-upgrade status`)", rerun: rerun, lost: true}
	case "53100": // disk_full
		return &envError{cause: "the server ran out of disk space (" + pgErr.Message + ")", hint: diskFullHint(diskFullApply)}
	case "53200": // out_of_memory
		hint := "look at what uses the server's memory: work_mem and maintenance_work_mem (the index builds) against max_connections and the memory of the machine, and other sessions"
		if strings.Contains(pgErr.Message, "shared memory") {
			hint = "raise max_locks_per_transaction (the upgrade locks every pgflow table and its indexes in one transaction; a server restart is needed), or close sessions that hold many locks"
		}
		return &envError{cause: "the server ran out of memory (" + pgErr.Message + ")", hint: hint}
	case "53300": // too_many_connections
		return &envError{cause: "the server has no connection slots left (" + pgErr.Message + ")",
			hint:  "close idle sessions, or raise max_connections (or the role's or database's CONNECTION LIMIT)",
			rerun: "a rerun gets through once a slot is free"}
	case "53400": // configuration_limit_exceeded
		return &envError{cause: "the server hit a configured limit (" + pgErr.Message + ")",
			hint: "raise the setting the server's message names"}
	case "25P03": // idle_in_transaction_session_timeout
		return &envError{cause: "the server ended the session because it sat idle inside its transaction for longer than idle_in_transaction_session_timeout (" +
			idleTimeoutOf(command) + "): this process was stopped or starved between two statements (SIGSTOP or Ctrl-Z, a suspended VM or laptop, a debugger, a machine out of CPU)",
			hint:  "run it where it is not interrupted (not in a shell where it can be suspended; `fg` resumes a job stopped with Ctrl-Z too late)",
			rerun: rerun, lost: true}
	}
	return nil
}

// What each path needs free on the disk.
const (
	diskFullApply  = "the upgrade rewrites step_tasks and builds its indexes"
	diskFullOnline = "the online backfill writes a new version of every step_tasks row and then builds its unique indexes"
)

// diskFullHint says what to free on a full disk, for the path that ran
// into it (what).
func diskFullHint(what string) string {
	return "free space on the volume of the server's data directory or of the tablespace that holds pgflow.step_tasks " +
		"(select spcname, pg_tablespace_location(oid) from pg_tablespace); " + what +
		", so it needs about the size of pgflow.step_tasks and its indexes free (`pgflow-upgrade audit` reports it), plus room for the WAL"
}

// idleTimeoutOf says which idle_in_transaction_session_timeout command's
// transactions run under, and where it comes from: the tool sets it itself,
// so that a client stopped inside a transaction cannot hold the pgflow
// locks for long.
func idleTimeoutOf(command string) string {
	switch {
	case command == "apply":
		return "6s, set by pgflow-upgrade on apply's transaction so that a stopped client cannot hold the pgflow locks"
	case strings.HasPrefix(command, "apply"):
		return "5s, set by pgflow-upgrade on each transaction of the online path so that a stopped client cannot hold the pgflow locks"
	}
	return "30s, set by pgflow-upgrade on its read-only transactions"
}

// connectionGone says whether err is the session ending under the work: the
// socket closed or reset, the connection closed by pgx after a fatal error.
func connectionGone(err error) bool {
	var lost *session.LostError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return false // the tool's own deadline or the operator's cancel: said where it happens
	case errors.As(err, &lost), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.As(err, &netErr):
		return true
	}
	return strings.HasSuffix(err.Error(), "conn closed")
}

// changedNothing is what a failed transaction of command left: for a run
// that changes the database, its transaction rolled back.
func changedNothing(command string) string {
	switch {
	case strings.HasPrefix(command, "apply"), strings.HasPrefix(command, "fixtures"):
		return "the transaction was rolled back: nothing was changed"
	}
	return command + " only reads: nothing was changed"
}

// explainRunFailure is Run's last look at an error no command reported:
// when it is an environment failure, the message says what happened,
// that nothing changed and what to do, with exit 3.
func explainRunFailure(err error, command string) error {
	if command == "" || exitCode(err) == ExitUsage || exitCode(err) == ExitInterrupted {
		return err
	}
	var env *envError
	if errors.As(err, &env) {
		return err
	}
	e := explainFailure(err, command)
	if e == nil {
		return err
	}
	return withCode(ExitEnvironment, fmt.Errorf("%s; %s", e.Error(), changedNothing(command)))
}

// nextStep is what to do before command can succeed: fix the cause, then
// run it again.
func (e *envError) nextStep(command string) string {
	var pgErr *pgconn.PgError
	if errors.As(e.err, &pgErr) && (pgErr.Code == "25P03" || pgErr.Code == "57P05" || pgErr.Code == "25P04") {
		return "the server is up: run `pgflow-upgrade " + command + "` again where nothing suspends it"
	}
	if e.lost {
		return "once the server accepts connections again (pg_isready), run `pgflow-upgrade status`, then `pgflow-upgrade " + command + "` again"
	}
	return "fix the cause above first, then run `pgflow-upgrade " + command + "` again"
}
