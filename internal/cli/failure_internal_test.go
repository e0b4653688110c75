package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestExplainFailure: each failure the environment causes is said as what
// happened and what to do, with exit 3, whatever command met it; a refusal
// or an unknown error is left alone.
func TestExplainFailure(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want []string // in the message; nil: not explained
	}{
		{"pgx's closed connection", fmt.Errorf("running the migration: %w", errors.New("conn closed")),
			[]string{"connection to the server was lost", "the server went away", "pg_isready", "run apply again"}},
		{"a lost session", &session.LostError{Err: errors.New("failed to receive message: unexpected EOF")},
			[]string{"connection to the server was lost", "pgflow-upgrade status"}},
		{"an EOF", fmt.Errorf("reading: %w", io.ErrUnexpectedEOF), []string{"connection to the server was lost"}},
		{"crash", &pgconn.PgError{Code: "57P02", Severity: "FATAL", Message: "terminating connection because of crash of another server process"},
			[]string{"the server crashed", "server log"}},
		{"recovery", &pgconn.PgError{Code: "57P03", Severity: "FATAL", Message: "the database system is in recovery mode"},
			[]string{"not accepting sessions yet", "recovering from a crash"}},
		{"terminated", &pgconn.PgError{Code: "57P01", Severity: "FATAL", Message: "terminating connection due to administrator command"},
			[]string{"shutting down, or an administrator terminated the session"}},
		{"disk full", &pgconn.PgError{Code: "53100", Message: `could not extend file "pg_tblspc/16385/PG_15_202209061/16384/16999": No space left on device`},
			[]string{"ran out of disk space", "No space left on device", "free space", "pg_tablespace_location", "a rerun fails the same way until then"}},
		{"out of memory", &pgconn.PgError{Code: "53200", Message: "out of memory"}, []string{"ran out of memory", "work_mem", "maintenance_work_mem"}},
		{"out of shared memory", &pgconn.PgError{Code: "53200", Message: "out of shared memory"}, []string{"max_locks_per_transaction"}},
		{"too many connections", &pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"}, []string{"no connection slots", "max_connections", "once a slot is free"}},
		{"idle in transaction", &pgconn.PgError{Code: "25P03", Severity: "FATAL", Message: "terminating connection due to idle-in-transaction timeout"},
			[]string{"idle_in_transaction_session_timeout (6s, set by pgflow-upgrade on apply's transaction", "stopped or starved", "SIGSTOP"}},
		{"a refusal", errors.New("preflight blockers found"), nil},
		{"the tool's own deadline", fmt.Errorf("reading: %w", context.DeadlineExceeded), nil},
		{"a unique violation", &pgconn.PgError{Code: "23505", Message: "duplicate key"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := explainFailure(c.err, "apply")
			if c.want == nil {
				if env != nil {
					t.Fatalf("explained as the environment: %s", env.Error())
				}
				return
			}
			if env == nil {
				t.Fatalf("not explained: %v", c.err)
			}
			msg := env.Error()
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the message does not say %q:\n%s", w, msg)
				}
			}
			if !strings.Contains(msg, c.err.Error()) {
				t.Errorf("the message lost the server's own words %q:\n%s", c.err.Error(), msg)
			}
			if !errors.Is(env, c.err) {
				t.Error("the cause is not reachable with errors.Is")
			}
			if got := exitCode(explainRunFailure(c.err, "status")); got != ExitEnvironment {
				t.Errorf("status meeting it exits %d, want %d", got, ExitEnvironment)
			}
		})
	}
	if msg := explainRunFailure(errors.New("conn closed"), "status").Error(); !strings.Contains(msg, "status only reads: nothing was changed") {
		t.Errorf("a read-only command's message does not say nothing changed:\n%s", msg)
	}
	// Online: the phases commit as they go, so a rerun continues.
	env := explainFailure(&pgconn.PgError{Code: "25P03"}, "apply").forOnline()
	if !strings.Contains(env.Error(), "5s, set by pgflow-upgrade on each transaction of the online path") || !strings.Contains(env.Error(), "continues from where this one stopped") {
		t.Errorf("apply --online, idle in transaction:\n%s", env.Error())
	}
}

// TestStatementTimeoutSaysWhichStatement: a database's statement_timeout
// that cancels one of apply's catalog reads is said as such; before, every
// 57014 was explained as "the migration's statements (the step_tasks
// rewrite, the index builds) take longer", which sends the operator after
// the wrong statement. Only a statement of the migration is said so.
func TestStatementTimeoutSaysWhichStatement(t *testing.T) {
	db := testdb.Baseline(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set statement_timeout = '50ms'"); err != nil {
		t.Fatal(err)
	}
	a := &App{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	tg, err := a.resolveWith(db.DSN, "apply", false)
	if err != nil {
		t.Fatal(err)
	}
	cancelled := fmt.Errorf("detecting the pgflow version: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"})
	read := a.diagnoseDuring(ctx, tg, cancelled, false)
	if read == nil {
		t.Fatal("a statement_timeout of the database is not diagnosed")
	}
	if msg := read.Error(); !strings.Contains(msg, "a catalog read or check of apply (not the migration itself) ran into statement_timeout 50ms, set on database") ||
		strings.Contains(msg, "step_tasks rewrite") || !strings.Contains(msg, "options=-cstatement_timeout=0") {
		t.Errorf("a catalog read cancelled:\n%s", msg)
	}
	migration := a.diagnoseDuring(ctx, tg, cancelled, true)
	if msg := migration.Error(); !strings.Contains(msg, "a statement of the migration ran into statement_timeout 50ms") || !strings.Contains(msg, "step_tasks rewrite") {
		t.Errorf("a statement of the migration cancelled:\n%s", msg)
	}
}
