package cli_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A client that dies or stops inside apply's locked window must not keep
// the pgflow tables locked: client_connection_check_interval (PostgreSQL
// 14+, set in every transaction by internal/session) makes the backend of a
// killed client stop mid-statement, and apply's
// idle_in_transaction_session_timeout (6 s, internal/upgrade) ends the
// session of a stopped one. Measured on the built binary against a database
// large enough that the statements under the locks take seconds.

// applyBackend is the pid of the apply's backend on db once it holds
// ACCESS EXCLUSIVE on pgflow.step_tasks and has been running one statement
// for at least 300 ms (0 while not).
func applyBackend(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var pid int
	err := db.Pool.QueryRow(context.Background(), `
		select a.pid from pg_catalog.pg_stat_activity a
		join pg_catalog.pg_locks l on l.pid = a.pid and l.granted and l.mode = 'AccessExclusiveLock'
		  and l.relation = 'pgflow.step_tasks'::pg_catalog.regclass
		where a.application_name = 'pgflow-upgrade apply' and a.state = 'active'
		  and a.query_start < pg_catalog.clock_timestamp() - interval '300 ms'
		limit 1`).Scan(&pid)
	if err != nil {
		return 0
	}
	return pid
}

// locksOf counts the relation locks pid holds.
func locksOf(t *testing.T, db *testdb.DB, pid int) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `select pg_catalog.count(*)::int from pg_catalog.pg_locks where pid = $1 and locktype = 'relation'`, pid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// idleInTransaction says whether pid is idle in a transaction.
func idleInTransaction(t *testing.T, db *testdb.DB, pid int) bool {
	t.Helper()
	var state string
	_ = db.Pool.QueryRow(context.Background(), `select state from pg_catalog.pg_stat_activity where pid = $1`, pid).Scan(&state)
	return state == "idle in transaction"
}

func TestLongDeadClientReleasesLocks(t *testing.T) {
	testdb.SkipUnlessLong(t, "a killed or stopped client's backend releases apply's locks")
	if testing.Short() {
		t.Skip("generates 300,000 step_tasks rows")
	}
	db := testdb.Baseline(t)
	ctx := context.Background()
	took, err := datagen.Generate(ctx, db.Pool, datagen.Shape{Tasks: 300_000, Flows: 2, TasksPerRun: 1000, LiveRuns: 2, LiveTasksPerRun: 5})
	if err != nil {
		t.Fatal(err)
	}
	var major int
	if err := db.Pool.QueryRow(ctx, `select pg_catalog.current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		t.Fatal(err)
	}
	t.Logf("generated 300,000 finished tasks in %s (PostgreSQL %d)", took.Round(time.Second), major)
	env := []string{"PGFLOW_UPGRADE_DSN=" + db.DSN}

	t.Run("kill -9", func(t *testing.T) {
		if major < 14 {
			t.Skipf("client_connection_check_interval needs PostgreSQL 14 (server %d)", major)
		}
		s := start(t, env, "apply", "--yes")
		var pid int
		until(t, "apply's backend in a statement under its locks", func() bool { pid = applyBackend(t, db); return pid != 0 }, s)
		if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		s.wait(t)
		if !eventually(func() bool { return locksOf(t, db, pid) == 0 }, 60*time.Second) {
			t.Fatal("the backend of the killed client still holds its locks after 60 s")
		}
		held := time.Since(killed)
		t.Logf("kill -9 in a statement under ACCESS EXCLUSIVE: the orphaned backend released its locks %s later", held.Round(10*time.Millisecond))
		if held > 2*time.Second {
			t.Errorf("the orphaned backend held its locks %s after the client died, want under 2 s", held)
		}
	})

	t.Run("SIGSTOP", func(t *testing.T) {
		s := start(t, env, "apply", "--yes")
		var pid int
		until(t, "apply's backend in a statement under its locks", func() bool { pid = applyBackend(t, db); return pid != 0 }, s)
		if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGKILL) })
		var idleSince time.Time
		released := eventually(func() bool {
			if idleSince.IsZero() && idleInTransaction(t, db, pid) {
				idleSince = time.Now()
			}
			return locksOf(t, db, pid) == 0
		}, 120*time.Second)
		if !released {
			t.Fatal("the stopped client's backend still holds its locks after 120 s")
		}
		total := time.Since(stopped)
		idle := time.Duration(0)
		if !idleSince.IsZero() {
			idle = time.Since(idleSince)
		}
		t.Logf("SIGSTOP in a statement under ACCESS EXCLUSIVE: locks released %s after the stop, %s after the backend went idle in transaction",
			total.Round(10*time.Millisecond), idle.Round(10*time.Millisecond))
		if idleSince.IsZero() || idle > 10*time.Second {
			t.Errorf("idle in transaction for %s before the server ended the session, want under 10 s", idle)
		}
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		s.wait(t)
	})

	// Both rolled back: the database is still the 0.16.0 baseline.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != 0 || !(strings.Contains(r.Stdout, "0.16.0") || strings.Contains(r.Stdout, "baseline")) {
		t.Fatalf("status after the dead clients: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestToolTransactionsCheckTheClient: every transaction a session of the
// tool opens (session.Tool) checks its client every session.ClientCheckInterval while
// a statement runs, and only the transaction: the session's own setting is
// left as the server has it.
func TestToolTransactionsCheckTheClient(t *testing.T) {
	db := testdb.Empty(t)
	ctx := context.Background()
	conn, err := session.OpenWith(ctx, db.DSN, session.Options{Purpose: session.Tool, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var major int
	if err := conn.QueryRow(ctx, `select pg_catalog.current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		t.Fatal(err)
	}
	if major < 14 {
		t.Skipf("client_connection_check_interval needs PostgreSQL 14 (server %d)", major)
	}
	interval := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		var v string
		if err := q.QueryRow(ctx, `select pg_catalog.current_setting('client_connection_check_interval')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	outside := interval(conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := time.ParseDuration(session.ClientCheckInterval)
	if err != nil {
		t.Fatal(err)
	}
	// A killed client's locks go about one interval after it died, plus
	// the abort on a busy server: the interval leaves most of a second to
	// the abort (1s left the locks up to 2.9 s on a loaded server).
	if want > 250*time.Millisecond {
		t.Errorf("session.ClientCheckInterval %s: a killed client's locks would not reliably go within a second", want)
	}
	if got := interval(tx); got != want.String() && got != session.ClientCheckInterval {
		t.Errorf("client_connection_check_interval in a transaction: %s, want %s", got, session.ClientCheckInterval)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if after := interval(conn); after != outside {
		t.Errorf("after the transaction: %s, want the session's %s", after, outside)
	}
}
