package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every statement here may run outside a transaction, where through a
// pooler that refuses the search_path startup parameter the pin of
// internal/session does not reach: built-ins and types are named with their
// schema (pg_catalog.text, not text).

// Server settings and roles that make a command fail the same way every
// time it runs: a standby, default_transaction_read_only, a role's or
// database's statement_timeout, missing privileges. They are named with
// where they come from and what to do, as an environment error (exit 3), so
// nobody is told to "run again" when a rerun cannot succeed.

// envError is a cause in the environment; a rerun fails the same way until
// it is fixed, unless rerun says otherwise.
type envError struct {
	cause string // what is wrong, and where it is set
	hint  string // what to do
	err   error  // the error it caused (nil when found beforehand)
	// rerun, when set, is what a rerun does instead (a rerun may get
	// through: see forOnline).
	rerun string
	// statementTimeout: the cause is a statement_timeout, reset this way.
	statementTimeout *timeoutSource
	// lost: the session ended (the server went away, or ended it): what
	// its open transaction did was rolled back by the server.
	lost bool
}

// timeoutSource says how to undo a statement_timeout where it is set.
type timeoutSource struct{ reset string }

func (e *envError) Error() string {
	rerun := e.rerun
	if rerun == "" {
		rerun = "a rerun fails the same way until then"
	}
	msg := e.cause + ": " + e.hint + " (" + rerun + ")"
	if e.err != nil {
		msg += ": " + e.err.Error()
	}
	return msg
}

// mayPass says whether a rerun may get through with the cause unchanged.
func (e *envError) mayPass() bool { return e.rerun != "" }

// forOnline rewords a diagnosis for apply --online. The online path sets
// statement_timeout itself on its long statements (the DDL, each batch,
// the index builds); a role's or database's statement_timeout only reaches
// its catalog reads and checks, which take longer or not depending on the
// server's load: a rerun continues from where the run stopped and may get
// through, or stop on the same timeout again.
func (e *envError) forOnline() *envError {
	var pgErr *pgconn.PgError
	if errors.As(e.err, &pgErr) && pgErr.Code == "53100" {
		e.hint = diskFullHint(diskFullOnline)
	}
	if e.lost {
		// Each phase commits as it goes: a rerun continues.
		e.rerun = "then run apply --online again: it continues from where this one stopped"
		if errors.As(e.err, &pgErr) && pgErr.Code == "25P03" {
			e.cause = strings.Replace(e.cause, idleTimeoutOf("apply"), idleTimeoutOf("apply --online"), 1)
		}
	}
	if errors.As(e.err, &pgErr) && pgErr.Code == "57014" && e.statementTimeout != nil {
		st := e.statementTimeout
		e.hint = fmt.Sprintf("apply --online bounds its long statements itself (the DDL, each batch, the index builds), but its catalog reads and checks "+
			"run under this timeout and one of them took longer; to be sure of the next run, run it without the timeout: add options=-cstatement_timeout=0 "+
			"to the DSN (or PGOPTIONS), or %s", st.reset)
		e.rerun = "a rerun continues from where this one stopped, and may get through or stop on this timeout again, depending on the server's load"
	}
	return e
}

func (e *envError) Unwrap() error { return e.err }

// setting is a server setting as this session sees it, and where it comes from.
type setting struct {
	value, source, role, database, file string
	line                                int
}

// readSetting reads setting name as conn's session sees it, and its source.
func readSetting(ctx context.Context, conn *pgx.Conn, name string) (setting, error) {
	var s setting
	var err error
	// Under the statement_timeout being diagnosed, this read can be
	// cancelled too: on a new session of a database nobody has used yet,
	// reading pg_settings first loads the session's catalog caches. What a
	// cancelled try loaded stays, so the next one gets further.
	for try := 0; try < 3; try++ {
		if s, err = readSettingOnce(ctx, conn, name); !isQueryCanceled(err) || ctx.Err() != nil {
			break
		}
	}
	return s, err
}

// isQueryCanceled says whether err is query_canceled (57014).
func isQueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}

func readSettingOnce(ctx context.Context, conn *pgx.Conn, name string) (setting, error) {
	var s setting
	err := conn.QueryRow(ctx, `
		select pg_catalog.current_setting($1), s.source, current_user::pg_catalog.text, pg_catalog.current_database()::pg_catalog.text,
		       coalesce(s.sourcefile, ''), coalesce(s.sourceline, 0)
		  from pg_catalog.pg_settings s where s.name operator(pg_catalog.=) $1`, name).
		Scan(&s.value, &s.source, &s.role, &s.database, &s.file, &s.line)
	return s, err
}

// where says where a setting's value comes from, in the words an operator
// can act on (pg_settings.source).
func (s setting) where(name string) (where, reset string) {
	role, db := pgx.Identifier{s.role}.Sanitize(), pgx.Identifier{s.database}.Sanitize()
	switch s.source {
	case "user":
		return "set on role " + s.role, fmt.Sprintf("ALTER ROLE %s RESET %s", role, name)
	case "database":
		return "set on database " + s.database, fmt.Sprintf("ALTER DATABASE %s RESET %s", db, name)
	case "database user":
		return fmt.Sprintf("set on role %s in database %s", s.role, s.database), fmt.Sprintf("ALTER ROLE %s IN DATABASE %s RESET %s", role, db, name)
	case "client":
		return "set by the connection (the DSN's options or PGOPTIONS)", "remove it from the DSN's options or PGOPTIONS"
	case "configuration file":
		return fmt.Sprintf("set in the server configuration (%s:%d)", s.file, s.line), "change it in the server configuration"
	default:
		return "set by the server (" + s.source + ")", "change it on the server"
	}
}

// applyPrecheck refuses, before apply takes any lock, what makes every
// write fail: a standby, a read-only default.
func applyPrecheck(ctx context.Context, conn *pgx.Conn) error {
	return writePrecheck(ctx, conn, "apply")
}

// writePrecheck refuses, before command writes anything, what makes every
// write fail: a standby, a read-only default. command names what would
// write (apply, fixtures load, fixtures replay).
func writePrecheck(ctx context.Context, conn *pgx.Conn, command string) error {
	var recovery bool
	if err := conn.QueryRow(ctx, `select pg_catalog.pg_is_in_recovery()`).Scan(&recovery); err != nil {
		return fmt.Errorf("checking the server: %w", err)
	}
	if recovery {
		return &envError{cause: "this server is a standby (pg_is_in_recovery() is true): it accepts no writes",
			hint: "point --dsn at the primary"}
	}
	ro, err := readSetting(ctx, conn, "default_transaction_read_only")
	if err != nil {
		return fmt.Errorf("checking default_transaction_read_only: %w", err)
	}
	if ro.value == "on" {
		where, reset := ro.where("default_transaction_read_only")
		return &envError{cause: "default_transaction_read_only is on, " + where + ": every transaction of " + command + " would be read-only",
			hint: "run " + command + " with it off: add options=-cdefault_transaction_read_only=off to the DSN (or PGOPTIONS), or " + reset +
				" (ALTER ... SET default_transaction_read_only = off)"}
	}
	return nil
}

// diagnose explains a failed command by the environment: first what needs
// no reading (explainFailure, failure.go: a lost server, a full disk, a
// server timeout), then, for a setting or a role a rerun runs into again,
// it opens a new connection with the same settings (the failed one may be
// gone) and reads where the cause comes from. It returns nil when the
// failure is something else.
func (a *App) diagnose(ctx context.Context, t *target, failure error) *envError {
	return a.diagnoseDuring(ctx, t, failure, false)
}

// diagnoseDuring is diagnose, told whether the failure came from the
// migration's own statements (the step_tasks rewrite, the index builds):
// a statement_timeout elsewhere stopped a catalog read or a check, and is
// not explained as the migration taking too long.
func (a *App) diagnoseDuring(ctx context.Context, t *target, failure error, inMigration bool) *envError {
	if failure == nil || ctx.Err() != nil {
		return nil
	}
	if env := explainFailure(failure, t.command); env != nil { // failure.go: no reading needed
		return env
	}
	var pgErr *pgconn.PgError
	if !errors.As(failure, &pgErr) {
		return nil
	}
	switch pgErr.Code {
	case "57014", "25006", "25P04", "57P05", "42501":
	default:
		return nil
	}
	conn, err := a.connect(context.WithoutCancel(ctx), t)
	if err != nil {
		return nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	switch pgErr.Code {
	case "57014": // query_canceled: not by us (ctx is alive), so by statement_timeout
		st, err := readSetting(ctx, conn, "statement_timeout")
		if err != nil || st.value == "0" {
			return nil
		}
		where, reset := st.where("statement_timeout")
		env := &envError{err: failure, statementTimeout: &timeoutSource{reset: reset}}
		if inMigration {
			env.cause = fmt.Sprintf("a statement of the migration ran into statement_timeout %s, %s", st.value, where)
			env.hint = "the migration's statements (the step_tasks rewrite, the index builds) take longer; run apply without it: add options=-cstatement_timeout=0 " +
				"to the DSN (or PGOPTIONS), or " + reset
		} else {
			env.cause = fmt.Sprintf("a catalog read or check of %s (not the migration itself) ran into statement_timeout %s, %s", t.command, st.value, where)
			env.hint = "these reads are short, but a busy server or a new session's first reads can take longer than so small a timeout; run without it: add options=-cstatement_timeout=0 " +
				"to the DSN (or PGOPTIONS), or " + reset
		}
		return env
	case "57P05", "25P04": // idle_session_timeout; transaction_timeout (PostgreSQL 17)
		name := map[string]string{"57P05": "idle_session_timeout", "25P04": "transaction_timeout"}[pgErr.Code]
		st, err := readSetting(ctx, conn, name)
		if err != nil || st.value == "0" {
			return nil
		}
		where, reset := st.where(name)
		return &envError{err: failure, lost: true, cause: fmt.Sprintf("the server ended the session: it ran into %s %s, %s", name, st.value, where),
			hint: fmt.Sprintf("add options=-c%s=0 to the DSN (or PGOPTIONS), or %s", name, reset)}
	case "25006": // read_only_sql_transaction
		if e := applyPrecheck(ctx, conn); e != nil {
			var env *envError
			if errors.As(e, &env) {
				env.err = failure
				return env
			}
		}
		return nil
	default: // 42501 insufficient_privilege
		var role string
		_ = conn.QueryRow(ctx, `select current_user::pg_catalog.text`).Scan(&role)
		ident := pgx.Identifier{role}.Sanitize()
		hint := "connect as the owner of the pgflow schema and its tables and functions (the role that ran pgflow's migrations) or a superuser: apply alters them, which only their owner may"
		if strings.HasPrefix(t.command, "audit") || t.command == "status" || t.command == "verify" {
			hint = "grant the read-only role what it reads (docs/hardening.md): GRANT USAGE ON SCHEMA pgflow, pgmq TO " + ident +
				"; GRANT SELECT ON ALL TABLES IN SCHEMA pgflow, pgmq TO " + ident
		}
		return &envError{err: failure, cause: fmt.Sprintf("role %s lacks a privilege (%s)", role, pgErr.Message), hint: hint}
	}
}

// withoutRerunAdvice removes the advice to run again from a message whose
// cause a rerun repeats.
func withoutRerunAdvice(msg string) string {
	for _, advice := range []string{
		"; run apply --online again to continue from where it stopped (or apply --rollback-online to undo)",
	} {
		msg = strings.ReplaceAll(msg, advice, "")
	}
	return msg
}
