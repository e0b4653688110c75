package quiesce_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// apply --quiesce on a live 0.16.0 database: every recorded value is back,
// the workers stopped cleanly before the switch, nothing is lost.
func TestApplyQuiesce(t *testing.T) {
	ctx := testCtx(t)
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := connect(t, s.db)

	var sawPaused bool
	q := quiesceOpts()
	q.Hooks.At = func(ctx context.Context, point string) error {
		if point != quiesce.PointPaused {
			return nil
		}
		// While paused: every function disabled, every pgflow job inactive,
		// the unrelated job untouched.
		v := snapshot(t, s.db)
		for fn, en := range v.Functions {
			if en {
				t.Errorf("while paused: worker function %s still enabled", fn)
			}
		}
		for job, active := range v.Jobs {
			if want := before.Jobs[job] && !isPgflowJob(job); active != want {
				t.Errorf("while paused: cron job %s active = %v, want %v", job, active, want)
			}
		}
		sawPaused = true
		return nil
	}
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q})
	if err != nil {
		t.Fatalf("apply --quiesce: %v (%+v)", err, rep)
	}
	if !sawPaused {
		t.Fatal("the paused point was never reached")
	}
	if rep.Outcome != upgrade.OutcomeApplied || rep.Quiesce == nil || !rep.Quiesce.Restored || !rep.Quiesce.Applied {
		t.Fatalf("report: outcome %s, quiesce %+v", rep.Outcome, rep.Quiesce)
	}
	if rep.Quiesce.WorkersDeprecated != 3 {
		t.Fatalf("%d workers deprecated, want 3", rep.Quiesce.WorkersDeprecated)
	}
	// 4 functions, upstream's 3 jobs and the pruning job; not "not_pgflow".
	if n := len(rep.Quiesce.Recorded); n != 8 {
		t.Fatalf("%d values recorded, want 8: %+v", n, rep.Quiesce.Recorded)
	}
	if st := state(t, conn); st != audit.StateUpgraded {
		t.Fatalf("state %s after apply --quiesce", st)
	}
	sameValues(t, before, snapshot(t, s.db), "after apply --quiesce")
	if recorded(t, conn) != nil {
		t.Fatal("the quiesce is still recorded after the restore")
	}
	s.workersStoppedCleanly(t)
	nothingLost(t, s.db)
}

func isPgflowJob(job string) bool {
	for _, suffix := range []string{"pgflow_ensure_workers", "pgflow_cleanup_logs", "pgflow_requeue_stalled_tasks", "my_prune"} {
		if len(job) > len(suffix) && job[len(job)-len(suffix):] == suffix {
			return true
		}
	}
	return false
}

// An interrupt at every step restores what was recorded; the upgrade is
// committed only when the interrupt came after it.
func TestQuiesceInterrupted(t *testing.T) {
	for _, point := range []string{quiesce.PointPaused, quiesce.PointDeprecated, quiesce.PointDrained, "migrate", quiesce.PointApplied} {
		t.Run(point, func(t *testing.T) {
			s := newScene(t, false)
			before := snapshot(t, s.db)
			conn := connect(t, s.db)
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			q := quiesceOpts()
			q.Hooks.At = func(ctx context.Context, p string) error {
				if p == point {
					cancel()
					return ctx.Err()
				}
				return nil
			}
			opts := upgrade.Options{Quiesce: q}
			opts.Hooks.BeforeStep = func(ctx context.Context, _ uint32, step string) error {
				if point == "migrate" && step == upgrade.StepMigrate {
					cancel()
					return ctx.Err()
				}
				return nil
			}
			rep, err := upgrade.Apply(ctx, conn, opts)
			if err == nil || upgrade.OutcomeOf(err) != upgrade.OutcomeInterrupted {
				t.Fatalf("interrupted at %s: err %v, outcome %s", point, err, upgrade.OutcomeOf(err))
			}
			if rep.Quiesce == nil || !rep.Quiesce.Restored {
				t.Fatalf("interrupted at %s: not restored: %+v", point, rep.Quiesce)
			}
			sameValues(t, before, snapshot(t, s.db), "after an interrupt at "+point)
			if recorded(t, conn) != nil {
				t.Fatal("the quiesce is still recorded after the restore")
			}
			want := audit.StateBaseline
			if point == quiesce.PointApplied {
				want = audit.StateUpgraded
			}
			if st := state(t, conn); st != want {
				t.Fatalf("state %s after an interrupt at %s, want %s", st, point, want)
			}
			s.stop()
		})
	}
}

// A crash at every step leaves the recorded state (status shows it);
// --resume-quiesce finishes the upgrade and restores, --undo-quiesce
// restores without upgrading (or after it, when the crash came after).
func TestQuiesceCrashResumeUndo(t *testing.T) {
	for _, point := range []string{quiesce.PointPaused, quiesce.PointDeprecated, quiesce.PointDrained, quiesce.PointApplied} {
		for _, finish := range []string{"resume", "undo"} {
			t.Run(point+"/"+finish, func(t *testing.T) {
				ctx := testCtx(t)
				s := newScene(t, false)
				before := snapshot(t, s.db)
				conn := connect(t, s.db)
				q := quiesceOpts()
				q.Hooks.Crash = true
				q.Hooks.At = func(ctx context.Context, p string) error {
					if p == point {
						return errors.New("simulated crash")
					}
					return nil
				}
				if _, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q}); err == nil {
					t.Fatal("the simulated crash did not fail apply")
				}
				st := recorded(t, conn)
				if st == nil || string(st.Phase) != point {
					t.Fatalf("after a crash at %s: recorded %+v", point, st)
				}
				info, err := quiesce.Status(ctx, conn)
				if err != nil || info == nil || info.Next != "pgflow-upgrade apply --resume-quiesce --yes" || info.Functions != 4 || info.CronJobs != 4 {
					t.Fatalf("status after a crash at %s: %+v, %v", point, info, err)
				}
				// A second quiesce is refused while one is recorded.
				if _, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()}); !errors.Is(err, quiesce.ErrInProgress) || upgrade.OutcomeOf(err) != upgrade.OutcomeRefused {
					t.Fatalf("a second apply --quiesce: %v", err)
				}
				want := audit.StateUpgraded
				if finish == "resume" {
					q := quiesceOpts()
					q.Resume = true
					rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q})
					if err != nil {
						t.Fatalf("--resume-quiesce after a crash at %s: %v", point, err)
					}
					if !rep.Quiesce.Restored || rep.Quiesce.ResumedFrom != quiesce.Phase(point) {
						t.Fatalf("resume report: %+v", rep.Quiesce)
					}
					s.workersStoppedCleanly(t)
					nothingLost(t, s.db)
				} else {
					rep, err := quiesce.Undo(ctx, conn)
					if err != nil || !rep.Restored {
						t.Fatalf("--undo-quiesce after a crash at %s: %v %+v", point, err, rep)
					}
					if point != quiesce.PointApplied {
						want = audit.StateBaseline
					}
				}
				sameValues(t, before, snapshot(t, s.db), "after "+finish+" from "+point)
				if recorded(t, conn) != nil {
					t.Fatal("the quiesce is still recorded")
				}
				if got := state(t, conn); got != want {
					t.Fatalf("state %s, want %s", got, want)
				}
				if _, err := quiesce.Undo(ctx, conn); !errors.Is(err, quiesce.ErrNothing) {
					t.Fatalf("a second undo: %v", err)
				}
				s.stop()
			})
		}
	}
}

// A handler that does not finish: the drain times out, everything is
// restored, nothing is upgraded.
func TestQuiesceDrainTimeout(t *testing.T) {
	ctx := testCtx(t)
	s := newScene(t, true)
	before := snapshot(t, s.db)
	conn := connect(t, s.db)
	q := quiesceOpts()
	q.DrainTimeout = 500 * time.Millisecond
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q})
	if !errors.Is(err, quiesce.ErrDrainTimeout) || upgrade.OutcomeOf(err) != upgrade.OutcomeRefused {
		t.Fatalf("drain timeout: %v", err)
	}
	if !rep.Quiesce.Restored || rep.Quiesce.Applied {
		t.Fatalf("report: %+v", rep.Quiesce)
	}
	sameValues(t, before, snapshot(t, s.db), "after a drain timeout")
	if st := state(t, conn); st != audit.StateBaseline {
		t.Fatalf("state %s after a drain timeout", st)
	}
	close(s.released)
}

// --dry-run changes nothing, and says what it would.
func TestQuiesceDryRun(t *testing.T) {
	ctx := testCtx(t)
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := connect(t, s.db)
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{DryRun: true, LockRetries: 5, Quiesce: quiesceOpts()})
	if err != nil {
		t.Fatalf("apply --quiesce --dry-run: %v", err)
	}
	if rep.Outcome != upgrade.OutcomeDryRun || rep.Quiesce == nil || len(rep.Quiesce.Plan) < 8 {
		t.Fatalf("dry run: outcome %s, quiesce %+v", rep.Outcome, rep.Quiesce)
	}
	inv := rep.Quiesce.Inventory
	if len(inv.Functions) != 4 || len(inv.CronJobs) != 4 || len(inv.Workers) != 3 || !inv.Cron || !inv.AlterJob {
		t.Fatalf("inventory: %+v", inv)
	}
	sameValues(t, before, snapshot(t, s.db), "after a dry run")
	var tables bool
	if err := conn.QueryRow(ctx, `select to_regclass('pgflow_upgrade.quiesce') is not null`).Scan(&tables); err != nil || tables {
		t.Fatalf("the dry run created %s (%v)", quiesce.StateTable, err)
	}
	var deprecated int
	if err := conn.QueryRow(ctx, `select count(*) from pgflow.workers where deprecated_at is not null`).Scan(&deprecated); err != nil || deprecated != 0 {
		t.Fatalf("the dry run deprecated %d worker(s) (%v)", deprecated, err)
	}
	s.stop()
}

// No pg_cron and no worker_functions rows: nothing to pause, the upgrade runs.
func TestQuiesceNothingToPause(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Baseline(t)
	exec(t, db, `drop schema cron cascade`, `delete from pgflow.worker_functions`)
	conn := connect(t, db)
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()})
	if err != nil {
		t.Fatalf("apply --quiesce without pg_cron and functions: %v", err)
	}
	if !rep.Quiesce.Restored || len(rep.Quiesce.Recorded) != 0 || state(t, conn) != audit.StateUpgraded {
		t.Fatalf("report: %s %+v", rep.Outcome, rep.Quiesce)
	}
}

// pg_cron without cron.alter_job: the jobs are not paused by writing to
// cron.job; the quiesce refuses before changing anything.
func TestQuiesceNoAlterJob(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Baseline(t)
	exec(t, db, `drop function cron.alter_job(bigint, text, text, text, text, boolean)`)
	before := snapshot(t, db)
	conn := connect(t, db)
	_, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()})
	if !errors.Is(err, quiesce.ErrCronAPI) || upgrade.OutcomeOf(err) != upgrade.OutcomeRefused {
		t.Fatalf("without cron.alter_job: %v", err)
	}
	sameValues(t, before, snapshot(t, db), "after the refusal")
	if recorded(t, conn) != nil || state(t, conn) != audit.StateBaseline {
		t.Fatal("the refusal changed something")
	}
}

// Ctrl-C while apply waits for a table lock (pgx cancels the query and
// closes the connection): the values are restored on a new connection.
func TestQuiesceInterruptedMidQuery(t *testing.T) {
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := connect(t, s.db)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	blocker, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.Background())
	q := quiesceOpts()
	q.Hooks.At = func(_ context.Context, p string) error {
		if p == quiesce.PointDrained {
			if _, err := blocker.Exec(context.Background(), `lock table pgflow.flows in access share mode`); err != nil {
				return err
			}
			time.AfterFunc(300*time.Millisecond, cancel)
		}
		return nil
	}
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q, LockTimeout: 10 * time.Second})
	if upgrade.OutcomeOf(err) != upgrade.OutcomeInterrupted {
		t.Fatalf("interrupted while waiting for a lock: %v", err)
	}
	if !rep.Quiesce.Restored {
		t.Fatalf("not restored: %v %+v", err, rep.Quiesce)
	}
	t.Logf("apply's connection closed by the cancel: %v", conn.IsClosed())
	blocker.Rollback(context.Background())
	sameValues(t, before, snapshot(t, s.db), "after an interrupt mid-query")
	other := connect(t, s.db)
	if recorded(t, other) != nil || state(t, other) != audit.StateBaseline {
		t.Fatal("still recorded, or upgraded")
	}
}
