package upgrade_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// TestLockErrorTellsTheTruth: a session of an application holds a lock on
// pgflow.step_tasks (not the first table of the lock order) through every
// attempt of apply. The lock error must say:
//   - the wait each attempt really had for that table: the shared budget of
//     the locks after the first (half of deadlock_timeout), not lock_timeout;
//   - how long the holder's transaction has been open when apply gave up,
//     which includes the whole of apply's own attempts (at least 4 attempts
//     of 0.5 s and 3 backoffs of at least 0.1, 0.2 and 0.4 s after the
//     holder began): measured against the start of apply's own transaction
//     it would be about 0 s;
//   - who the holder is: its user and its application_name, quoted.
func TestLockErrorTellsTheTruth(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Inflight(t, 3)

	const app = "billing worker, v2"
	holder, err := session.OpenWith(ctx, db.DSN, session.Options{Purpose: session.Application, Name: app})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	var holderPID int32
	var holderUser string
	if err := holder.QueryRow(ctx, `select pg_catalog.pg_backend_pid(), current_user::text`).Scan(&holderPID, &holderUser); err != nil {
		t.Fatal(err)
	}
	htx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer htx.Rollback(context.Background())
	if _, err := htx.Exec(ctx, `lock table pgflow.step_tasks in row exclusive mode`); err != nil {
		t.Fatal(err)
	}

	conn := testdb.Connect(t, db.DSN)
	var deadlockMS float64
	if err := conn.QueryRow(ctx, `select extract(epoch from current_setting('deadlock_timeout')::interval) * 1000`).Scan(&deadlockMS); err != nil {
		t.Fatal(err)
	}
	opts := fastOpts()
	opts.LockTimeout = 3 * time.Second
	opts.LockRetries = 3
	wantWait := min(opts.LockTimeout, time.Duration(deadlockMS/2)*time.Millisecond)
	if wantWait >= opts.LockTimeout {
		t.Fatalf("deadlock_timeout %vms leaves no budget below lock_timeout %s: the test needs the default 1s", deadlockMS, opts.LockTimeout)
	}
	_, applyErr := upgrade.Apply(ctx, conn, opts)

	var age float64
	if err := db.Pool.QueryRow(ctx, `select extract(epoch from clock_timestamp() - xact_start) from pg_stat_activity where pid = $1`, holderPID).Scan(&age); err != nil {
		t.Fatal(err)
	}
	var tle *upgrade.TableLockError
	if !errors.As(applyErr, &tle) {
		t.Fatalf("apply: %v, want a TableLockError", applyErr)
	}
	msg := applyErr.Error()
	t.Logf("holder's transaction open %.1fs when apply returned; apply said:\n%s", age, msg)
	if tle.Table != "step_tasks" || tle.Attempts != 4 {
		t.Fatalf("table %s after %d attempts, want step_tasks after 4", tle.Table, tle.Attempts)
	}
	if tle.Wait != wantWait || !strings.Contains(msg, fmt.Sprintf("each waiting at most %s (", wantWait)) || strings.Contains(msg, "at most "+opts.LockTimeout.String()) {
		t.Errorf("wait %s, want %s (half of deadlock_timeout, what the attempts on step_tasks used), said as such", tle.Wait, wantWait)
	}
	var b *upgrade.Blocker
	for i := range tle.Blockers {
		if tle.Blockers[i].PID == holderPID {
			b = &tle.Blockers[i]
		}
	}
	if b == nil {
		t.Fatalf("the holder pid %d is not named: %+v", holderPID, tle.Blockers)
	}
	if b.XactSeconds < 2 || float64(b.XactSeconds) > age+1 {
		t.Errorf("holder's transaction open %ds in the message; it had been open at least 2.7 s when apply gave up and %.1fs when apply returned", b.XactSeconds, age)
	}
	if !strings.Contains(msg, fmt.Sprintf("transaction open %ds", b.XactSeconds)) {
		t.Errorf("the message does not give the holder's transaction age %ds", b.XactSeconds)
	}
	for _, w := range []string{fmt.Sprintf("pid %d (user %q, application %q, idle in transaction", holderPID, holderUser, app), "holds RowExclusiveLock"} {
		if !strings.Contains(msg, w) {
			t.Errorf("the message does not say %q", w)
		}
	}
	if b.BackendType != "client backend" || b.Autovacuum() {
		t.Errorf("backend type %q, want client backend", b.BackendType)
	}
}

// TestBlockerNamesTheBackend: how a lock holder is written for each kind
// of server process, including the ones pg_stat_activity gives no user or
// application for (an autovacuum worker).
func TestBlockerNamesTheBackend(t *testing.T) {
	for _, c := range []struct {
		b       upgrade.Blocker
		want    string
		notWant string
	}{
		{upgrade.Blocker{PID: 7, BackendType: "autovacuum worker", Mode: "ShareUpdateExclusiveLock", Granted: true, XactSeconds: 17},
			"pid 7 (autovacuum worker, PostgreSQL's own vacuum of the table, running 17s) holds ShareUpdateExclusiveLock", "user"},
		{upgrade.Blocker{PID: 7, BackendType: "autovacuum worker", Wraparound: true, Mode: "ShareUpdateExclusiveLock", Granted: true, XactSeconds: 3},
			"to prevent wraparound (neither PostgreSQL nor apply cancels it", "user"},
		{upgrade.Blocker{PID: 8, BackendType: "client backend", User: "app", State: "active", Mode: "RowExclusiveLock", Granted: true, XactSeconds: 2},
			`pid 8 (user "app", application (none set), active, transaction open 2s) holds RowExclusiveLock`, ""},
		{upgrade.Blocker{PID: 9, BackendType: "client backend", User: "app", ApplicationName: "a, b", State: "active", Mode: "AccessShareLock"},
			`application "a, b"`, "holds"},
		{upgrade.Blocker{PID: 10, BackendType: "background worker", Mode: "AccessShareLock", Granted: true, XactSeconds: 4},
			"pid 10 (background worker, transaction open 4s) holds", "user"},
	} {
		s := c.b.String()
		if !strings.Contains(s, c.want) || (c.notWant != "" && strings.Contains(s, c.notWant)) {
			t.Errorf("%+v:\n  %s\nwant %q (and not %q)", c.b, s, c.want, c.notWant)
		}
	}
}

// TestLockHoldersSeeNewSessionsInATransaction: apply names the holders from
// inside its transaction, after earlier reads of pg_stat_activity in it; a
// session that took its lock since must still be named with who it is (the
// server keeps pg_stat_activity's rows of a transaction's first read).
func TestLockHoldersSeeNewSessionsInATransaction(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Inflight(t, 3)
	conn := testdb.Connect(t, db.DSN)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	// What apply's transaction has done before it names holders: read
	// pg_stat_activity (the autovacuum cancel, an earlier attempt).
	if _, err := upgrade.CancelAutovacuum(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `select pg_catalog.count(*) from pg_catalog.pg_stat_activity`); err != nil {
		t.Fatal(err)
	}

	late, err := session.OpenWith(ctx, db.DSN, session.Options{Purpose: session.Application, Name: "late holder"})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close(context.Background())
	ltx, err := late.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ltx.Rollback(context.Background())
	if _, err := ltx.Exec(ctx, `lock table pgflow.step_tasks in access share mode`); err != nil {
		t.Fatal(err)
	}

	after, err := upgrade.LockHolders(ctx, tx, "step_tasks", "access exclusive")
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 1 || after[0].ApplicationName != "late holder" || after[0].BackendType != "client backend" || after[0].User == "" {
		t.Fatalf("holders after a session took its lock: %+v, want it named (application \"late holder\", a client backend, its user)", after)
	}
}
