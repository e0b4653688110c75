package cli_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// The fault-injection suite (docs/hardening.md, "Faults"): the server
// crashes under apply and under each step of apply --online, the disk fills
// under apply and under the online backfill. Each case asserts that nothing
// was lost (every row and message of before is there, unchanged), the
// exact words the operator reads, and that the rerun completes the
// upgrade. The stopped client is TestLongStoppedClientResumedIsExplained
// (failure_test.go), the killed replay TestReplayRemovesItsKilledRunsClusters
// (stale_replay_test.go).
//
// A crash: a server process of the cluster is killed with SIGKILL, and
// PostgreSQL does what it does after any backend dies abnormally: it ends
// every session, reinitialises shared memory and runs crash recovery from
// the WAL before it accepts sessions again, as a restart after
// `pg_ctl -m immediate stop` does. The killed process is the one running
// the tool's statement (the OOM killer's usual victim), so the tool sees
// its connection close under it. The cluster is the test's own: a crash
// ends every session of the server.

// faultServer is a cluster of the test's own with a database template of
// tasks rows in flight and finished (datagen), from which each case gets a
// copy.
type faultServer struct {
	srv      *pgprovider.Server
	template string
}

func newFaultServer(t *testing.T, tasks int64) *faultServer {
	t.Helper()
	ctx := context.Background()
	// A commit must survive the crash as it does in production: the
	// provider's default (synchronous_commit off) loses a transaction
	// committed just before it, e.g. the online path's expand.
	srv, err := pgprovider.Open(ctx, pgprovider.Options{SkipDocker: true, ReuseInitdb: true, Settings: map[string]string{"synchronous_commit": "on"}})
	if err != nil {
		t.Fatalf("a local cluster of the test's own: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	fs := &faultServer{srv: srv, template: "pgflow_upgrade_faults_tpl"}
	if err := srv.CreateDatabase(ctx, fs.template, ""); err != nil {
		t.Fatal(err)
	}
	dsn := srv.DSNFor(fs.template)
	if r := clitest.Run(t, nil, "--dsn", dsn, "fixtures", "load", "inflight"); r.Code != cli.ExitOK {
		t.Fatalf("fixtures load: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	pool := faultPool(t, dsn)
	took, err := datagen.Generate(ctx, pool, datagen.Shape{Tasks: tasks, Flows: 2, TasksPerRun: 1000, LiveRuns: 2, LiveTasksPerRun: 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "analyze"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	t.Logf("fault cluster %s: %d finished tasks and live runs generated in %s", srv.Describe(), tasks, took.Round(time.Millisecond))
	return fs
}

// copy is a new database cloned from the template, its DSN.
func (fs *faultServer) copy(t *testing.T, name string) string {
	t.Helper()
	if err := fs.srv.CreateDatabase(context.Background(), name, fs.template); err != nil {
		t.Fatal(err)
	}
	return fs.srv.DSNFor(name)
}

func faultPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := session.OpenPool(context.Background(), dsn, session.Options{Purpose: session.Admin})
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// takeFingerprint is every row and message of the database at dsn.
func takeFingerprint(t *testing.T, dsn string) *fingerprint.Fingerprint {
	t.Helper()
	pool := faultPool(t, dsn)
	defer pool.Close()
	fp, err := fingerprint.Take(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// nothingLost fails the test when a row or message of before is missing
// or changed at dsn; with upgraded, the new columns must be right too.
func nothingLost(t *testing.T, dsn string, before *fingerprint.Fingerprint, upgraded bool, when string) {
	t.Helper()
	if d := fingerprint.Compare(before, takeFingerprint(t, dsn)); len(d) != 0 {
		t.Fatalf("%s: rows or messages lost or changed:\n%s", when, fingerprint.Format(d, 20))
	}
	if !upgraded {
		return
	}
	pool := faultPool(t, dsn)
	defer pool.Close()
	d, err := fingerprint.CheckNewColumns(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 0 {
		t.Fatalf("%s: new columns wrong:\n%s", when, fingerprint.Format(d, 20))
	}
}

// backendWhere is the pid of a backend of database db matching cond (SQL
// over pg_stat_activity a), 0 when none.
func backendWhere(ctx context.Context, admin *pgx.Conn, db, cond string) int {
	var pid int
	_ = admin.QueryRow(ctx, `select a.pid from pg_catalog.pg_stat_activity a
		where a.datname = $1 and a.pid <> pg_catalog.pg_backend_pid() and `+cond+` limit 1`, db).Scan(&pid)
	return pid
}

// crashWhen runs args (a command of the tool) on dsn in-process and, once a
// backend of database db matches cond, kills that backend with SIGKILL: the
// server crashes and recovers. It returns the command's result once the
// server accepts sessions again.
func (fs *faultServer) crashWhen(t *testing.T, db, cond string, args ...string) clitest.Result {
	t.Helper()
	ctx := context.Background()
	// On the database itself: pg_locks' relation oids are its own.
	admin, err := session.Open(ctx, fs.srv.DSNFor(db), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan int, 1)
	done := make(chan struct{})
	go func() {
		defer admin.Close(context.Background())
		for {
			select {
			case <-done:
				killed <- 0
				return
			case <-time.After(10 * time.Millisecond):
			}
			if pid := backendWhere(ctx, admin, db, cond); pid != 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				// The postmaster resets every session, this one too, when it
				// notices: wait for that, so that waitUp does not take the
				// server still up before its reset for the server back.
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if _, err := admin.Exec(ctx, "select 1"); err != nil {
						break
					}
				}
				killed <- pid
				return
			}
		}
	}()
	r := clitest.Run(t, nil, args...)
	close(done)
	if pid := <-killed; pid == 0 {
		t.Fatalf("the backend to crash (%s) was never seen; %v: exit %d\n%s%s", cond, args, r.Code, r.Stdout, r.Stderr)
	} else {
		t.Logf("killed backend %d (%s): the server crashed", pid, cond)
	}
	fs.waitUp(t)
	return r
}

// waitUp waits until the server accepts sessions again after a crash.
func (fs *faultServer) waitUp(t *testing.T) {
	t.Helper()
	start := time.Now()
	for {
		conn, err := session.Open(context.Background(), fs.srv.AdminDSN(), session.Admin)
		if err == nil {
			conn.Close(context.Background())
			t.Logf("the server accepts sessions again %s after the command ended", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("the server did not come back within 2 minutes: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// says fails the test unless out (white space folded) holds every phrase.
func says(t *testing.T, out string, phrases ...string) {
	t.Helper()
	text := flat(out)
	for _, p := range phrases {
		if !strings.Contains(text, p) {
			t.Errorf("the operator does not read %q", p)
		}
	}
}

// The operator's words after a crash, as docs/hardening.md quotes them.
const (
	crashApplyMessage   = "the connection to the server was lost (the server went away: a crash, a restart, a failover, a terminated session or a network failure): check that the server is back (pg_isready, or `pgflow-upgrade status`) (then run apply again: it starts over)"
	crashApplyLeft      = "the transaction was rolled back: nothing was changed"
	crashApplyNext      = "next step: once the server accepts connections again (pg_isready), run `pgflow-upgrade status`, then `pgflow-upgrade apply` again"
	crashOnlineMessage  = "the connection to the server was lost (the server went away: a crash, a restart, a failover, a terminated session or a network failure): check that the server is back (pg_isready, or `pgflow-upgrade status`) (then run apply --online again: it continues from where this one stopped)"
	crashOnlineRemains  = "remains in the database: the online upgrade at phase"
	crashOnlineContinue = "run apply --online again to continue from there, or apply --rollback-online to undo it"
)

// TestLongFaultServerCrash: the server crashes during apply's rewrite of
// step_tasks, during the online backfill, during the online unique index
// build (CONCURRENTLY, which leaves an invalid index behind) and during the
// online switch (its transaction waiting for a table lock). Each time:
// exit 3, the operator's words above, nothing lost, and the rerun upgrades.
func TestLongFaultServerCrash(t *testing.T) {
	testdb.SkipUnlessLong(t, "the server crashes under apply and under each step of apply --online: nothing lost, the message, the rerun")
	fs := newFaultServer(t, 100_000)
	cases := []struct {
		name   string
		online bool
		cond   string // the backend to kill
		hold   string // a lock the test holds while the command runs ("" none)
		extra  []string
	}{
		{name: "apply, in the rewrite of step_tasks",
			cond: `a.application_name = 'pgflow-upgrade apply' and a.state = 'active' and a.query_start < pg_catalog.clock_timestamp() - interval '100 ms'
				and exists (select from pg_catalog.pg_locks l where l.pid = a.pid and l.granted and l.mode = 'AccessExclusiveLock'
				            and l.relation = pg_catalog.to_regclass('pgflow.step_tasks'))`},
		{name: "apply --online, in the backfill", online: true, extra: []string{"--max-rate", "20000"},
			cond: `a.application_name like 'pgflow-upgrade%' and exists (select from pg_catalog.pg_class c where c.oid = pg_catalog.to_regclass('pgflow_upgrade.online_progress'))
				and a.query ilike '%update pgflow.step_tasks%'`},
		{name: "apply --online, in the unique index build", online: true,
			cond: `a.state = 'active' and a.query ilike 'create unique index concurrently%'`},
		{name: "apply --online, in the switch", online: true, hold: "lock table pgflow.deps in row exclusive mode", // a writer's lock: the switch's EXCLUSIVE waits
			cond: `a.application_name like 'pgflow-upgrade%' and a.wait_event_type = 'Lock' and a.query ilike '%deps%'`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("pgflow_upgrade_fault_crash_%d", i)
			dsn := fs.copy(t, name)
			before := takeFingerprint(t, dsn)
			if c.hold != "" {
				// A plain session: the tool's own sessions would end an idle
				// transaction after a few seconds. The crash ends it.
				holder, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { holder.Close(context.Background()) })
				if _, err := holder.Exec(context.Background(), "set idle_in_transaction_session_timeout = 0"); err != nil {
					t.Fatal(err)
				}
				tx, err := holder.Begin(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(context.Background(), c.hold); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"--dsn", dsn, "apply", "--yes"}
			if c.online {
				args = append(args, "--online", "--lock-retries", "50")
			}
			r := fs.crashWhen(t, name, c.cond, append(args, c.extra...)...)
			out := r.Stdout + r.Stderr
			t.Logf("exit %d\n%s", r.Code, out)
			if r.Code != cli.ExitEnvironment {
				t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
			}
			if c.online {
				says(t, out, crashOnlineMessage, crashOnlineRemains, crashOnlineContinue)
			} else {
				says(t, out, crashApplyMessage, crashApplyLeft, crashApplyNext)
			}
			nothingLost(t, dsn, before, false, "after the crash")

			args = []string{"--dsn", dsn, "apply", "--yes"}
			if c.online {
				args = append(args, "--online")
			}
			if r := clitest.Run(t, nil, args...); r.Code != cli.ExitOK {
				t.Fatalf("the rerun: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			nothingLost(t, dsn, before, true, "after the rerun")
			if r := clitest.Run(t, nil, "--dsn", dsn, "verify"); r.Code != cli.ExitOK {
				t.Fatalf("verify after the rerun: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// The operator's words on a full disk, as docs/hardening.md quotes them.
const (
	diskFullCause       = "the server ran out of disk space ("
	diskFullHint        = "free space on the volume of the server's data directory or of the tablespace that holds pgflow.step_tasks"
	diskFullRerun       = "(a rerun fails the same way until then)"
	diskFullApplyNext   = "next step: fix the cause above first, then run `pgflow-upgrade apply` again"
	diskFullOnlineAfter = "once the cause is fixed, apply --online continues from there; apply --rollback-online undoes it"
)

// TestLongFaultDiskFull: the disk fills under apply's rewrite and under the
// online backfill (pgflow.step_tasks in an 8 MB tablespace on a tmpfs,
// skipped without root, saying so). Each time: exit 3, the operator's
// words, nothing lost; once space is freed (the table moved back to
// pg_default), the rerun upgrades.
func TestLongFaultDiskFull(t *testing.T) {
	testdb.SkipUnlessLong(t, "the disk fills under apply and under the online backfill: nothing lost, the message, the rerun")
	for _, online := range []bool{false, true} {
		name := "apply"
		if online {
			name = "apply --online (backfill)"
		}
		t.Run(name, func(t *testing.T) {
			db, _ := fullDiskDB(t)
			before := db.Fingerprint(t)
			args := []string{"--dsn", db.DSN, "apply", "--yes"}
			if online {
				args = append(args, "--online")
			}
			r := clitest.Run(t, nil, args...)
			out := r.Stdout + r.Stderr
			t.Logf("exit %d\n%s", r.Code, out)
			if r.Code != cli.ExitEnvironment {
				t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
			}
			says(t, out, diskFullCause, "No space left on device", diskFullHint, diskFullRerun)
			if online {
				says(t, out, "remains in the database: the online upgrade at phase", diskFullOnlineAfter, "the online backfill writes a new version of every step_tasks row")
			} else {
				says(t, out, crashApplyLeft, diskFullApplyNext)
			}
			nothingLost(t, db.DSN, before, false, "after the full disk")
			db.Exec(t, "alter table pgflow.step_tasks set tablespace pg_default") // space freed
			if r := clitest.Run(t, nil, args...); r.Code != cli.ExitOK {
				t.Fatalf("the rerun with space: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			nothingLost(t, db.DSN, before, true, "after the rerun")
		})
	}
}
