package cli_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestApplySessionEndedUnderIt: the server ends apply's session while apply
// waits for its table locks (pg_terminate_backend, as a shutdown, a
// failover or an administrator does). Before, apply printed the bare
// driver error and exit 1 with the "ready" next step; now it says the
// server ended the session, that nothing changed, how to check the server
// and to run apply again (exit 3), and the rerun upgrades.
func TestApplySessionEndedUnderIt(t *testing.T) {
	db := testdb.Baseline(t)
	ctx := context.Background()
	before := testdb.State(t, db.Pool)
	release := db.HoldLock(t, "lock table pgflow.step_tasks in access share mode")

	done := make(chan struct{})
	var terminated bool
	go func() {
		defer close(done)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var ok bool
			err := db.Pool.QueryRow(ctx, `select pg_catalog.pg_terminate_backend(pid) from pg_catalog.pg_stat_activity
				where datname = pg_catalog.current_database() and application_name = 'pgflow-upgrade apply' and wait_event_type = 'Lock'`).Scan(&ok)
			if err == nil && ok {
				terminated = true
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes", "--lock-retries", "50")
	<-done
	out := r.Stdout + r.Stderr
	t.Logf("exit %d\n%s", r.Code, out)
	if !terminated {
		t.Fatal("apply's backend was never seen waiting for its lock")
	}
	if r.Code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d (the environment)", r.Code, cli.ExitEnvironment)
	}
	text := strings.Join(strings.Fields(out), " ")
	for _, w := range []string{"an administrator terminated the session", "the transaction was rolled back: nothing was changed",
		"pg_isready", "next step: once the server accepts connections again (pg_isready), run `pgflow-upgrade status`, then `pgflow-upgrade apply` again"} {
		if !strings.Contains(text, w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	if strings.Contains(text, "ready: run") {
		t.Error("the output gives the ready-to-apply next step of a database nothing stopped")
	}
	release()
	testdb.SameState(t, before, testdb.State(t, db.Pool), "after the ended session")
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("the rerun: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestLongStoppedClientResumedIsExplained: apply is stopped (SIGSTOP) inside its
// transaction; its statement ends, the session sits idle in the
// transaction, and the server ends it at apply's own
// idle_in_transaction_session_timeout (6 s). On SIGCONT apply's next
// statement meets the closed session. Before, the message was the bare
// chain ending in "FATAL: terminating connection due to
// idle-in-transaction timeout (SQLSTATE 25P03)"; now it names the timeout,
// its value and who set it, that the process was stopped, that nothing
// changed, and exits 3; the rerun applies.
func TestLongStoppedClientResumedIsExplained(t *testing.T) {
	testdb.SkipUnlessLong(t, "a client stopped inside apply's transaction, resumed after the server's idle timeout ended its session (about 10 s)")
	db := testdb.Baseline(t)
	before := testdb.State(t, db.Pool)
	release := db.HoldLock(t, "lock table pgflow.step_tasks in access share mode")
	s := start(t, []string{"PGFLOW_UPGRADE_DSN=" + db.DSN}, "apply", "--yes", "--lock-retries", "50", "--lock-timeout", "10s")
	until(t, "apply waiting for its table locks", func() bool { return backends(t, "pgflow-upgrade apply", db.Name, true) > 0 }, s)
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
	release() // apply's lock is granted while it is stopped: its session goes idle in its transaction
	if !eventually(func() bool { return backends(t, "pgflow-upgrade apply", db.Name, false) == 0 }, 30*time.Second) {
		t.Fatal("the server did not end the stopped apply's session within 30 s")
	}
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	code := s.wait(t)
	out := s.output()
	t.Logf("exit %d\n%s", code, out)
	if code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d", code, cli.ExitEnvironment)
	}
	text := strings.Join(strings.Fields(out), " ")
	for _, w := range []string{"idle_in_transaction_session_timeout (6s, set by pgflow-upgrade on apply's transaction",
		"this process was stopped or starved between two statements", "the transaction was rolled back: nothing was changed", "SQLSTATE 25P03", "next step: the server is up: run `pgflow-upgrade apply` again where nothing suspends it"} {
		if !strings.Contains(text, w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "after the stopped client")
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("the rerun: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestOnlineLockFailureNamesHolders: apply --online's own lock attempts
// (before its switch) give up on a session that holds pgflow.steps; the
// message names that session (pid, user, application, transaction age),
// as apply's does. Before, it said only "locks not obtained in N attempts".
func TestOnlineLockFailureNamesHolders(t *testing.T) {
	db := testdb.Baseline(t)
	db.HoldLock(t, "select pg_catalog.set_config('application_name', 'the-lock-holder', true); lock table pgflow.steps in access share mode")
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--online", "--yes", "--lock-retries", "1", "--lock-timeout", "100ms")
	out := flat(r.Stdout + r.Stderr)
	t.Logf("exit %d\n%s", r.Code, r.Stdout+r.Stderr)
	if r.Code != cli.ExitFindings || !strings.Contains(out, "locks not obtained in 2 attempts") ||
		!strings.Contains(out, "the sessions holding locks on the pgflow tables now") || !strings.Contains(out, `"the-lock-holder"`) {
		t.Errorf("exit %d; the lock failure does not name its holder", r.Code)
	}
}

// TestApplyPrintsNoWarningAboutNothing: on a 0.16.0 database without
// queues apply's dry run has no warning to print, so no "warnings (not
// blocking):" header either (it was printed over a backup warning about
// "all 0 queue(s)").
func TestApplyPrintsNoWarningAboutNothing(t *testing.T) {
	db := testdb.Baseline(t)
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--dry-run", "--yes")
	if r.Code != cli.ExitOK || strings.Contains(r.Stdout, "warnings (not blocking):") || strings.Contains(r.Stdout, "0 queue(s)") {
		t.Fatalf("apply --dry-run without queues: exit %d\n%s", r.Code, r.Stdout)
	}
}

// TestRollbackOnlineSessionEndedUnderIt: apply --rollback-online, whose
// session the server ends while it waits for a table lock, says so as
// apply does (exit 3, the cause, what to do), not the bare driver error.
func TestRollbackOnlineSessionEndedUnderIt(t *testing.T) {
	db := testdb.Baseline(t)
	stopOnlineAt(t, db, online.PointIndex)
	db.HoldLock(t, "lock table pgflow.step_tasks in access share mode")
	ctx := context.Background()
	done := make(chan bool)
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var ok bool
			if db.Pool.QueryRow(ctx, `select pg_catalog.pg_terminate_backend(pid) from pg_catalog.pg_stat_activity
				where datname = pg_catalog.current_database() and application_name like 'pgflow-upgrade%' and wait_event_type = 'Lock'`).Scan(&ok) == nil && ok {
				done <- true
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- false
	}()
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--rollback-online", "--yes", "--lock-retries", "50")
	if !<-done {
		t.Fatalf("the rollback's backend was never seen waiting for its lock: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	t.Logf("exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	if r.Code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
	}
	says(t, r.Stdout+r.Stderr, "an administrator terminated the session", "(then run apply --rollback-online again: it starts over)",
		"`pgflow-upgrade status` shows where it stands")
}
