package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
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
	r := run(t, nil, "--dsn", db.DSN, "apply", "--yes", "--lock-retries", "50")
	<-done
	out := r.stdout + r.stderr
	t.Logf("exit %d\n%s", r.code, out)
	if !terminated {
		t.Fatal("apply's backend was never seen waiting for its lock")
	}
	if r.code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d (the environment)", r.code, cli.ExitEnvironment)
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
	if r := run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.code != cli.ExitOK {
		t.Fatalf("the rerun: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
