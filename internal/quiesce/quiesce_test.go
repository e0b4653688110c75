package quiesce_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// apply --quiesce on a live 0.16.0 database: every recorded value is back,
// the workers stopped cleanly before the switch, nothing is lost.
func TestApplyQuiesce(t *testing.T) {
	ctx := testCtx(t)
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := testdb.Connect(t, s.db.DSN)

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
	if rep.Outcome != outcome.Applied || rep.Report.Quiesce == nil || !rep.Report.Quiesce.Restored || !rep.Report.Quiesce.Applied {
		t.Fatalf("report: outcome %s, quiesce %+v", rep.Outcome, rep.Report.Quiesce)
	}
	if rep.Report.Quiesce.WorkersDeprecated != 3 {
		t.Fatalf("%d workers deprecated, want 3", rep.Report.Quiesce.WorkersDeprecated)
	}
	// 4 functions, upstream's 3 jobs and the pruning job; not "not_pgflow".
	if n := len(rep.Report.Quiesce.Recorded); n != 8 {
		t.Fatalf("%d values recorded, want 8: %+v", n, rep.Report.Quiesce.Recorded)
	}
	if st := state(t, conn); st != versions.SchemaUpgraded {
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
	testdb.SkipIfShort(t, "An interrupt at every step restores what was recorded; the upgrade is committed only...")
	for _, point := range []string{quiesce.PointPaused, quiesce.PointDeprecated, quiesce.PointDrained, "migrate", quiesce.PointApplied} {
		t.Run(point, func(t *testing.T) {
			s := newScene(t, false)
			before := snapshot(t, s.db)
			conn := testdb.Connect(t, s.db.DSN)
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
			if err == nil || rep.Outcome != outcome.Interrupted {
				t.Fatalf("interrupted at %s: err %v, outcome %s", point, err, rep.Outcome)
			}
			if rep.Report.Quiesce == nil || !rep.Report.Quiesce.Restored {
				t.Fatalf("interrupted at %s: not restored: %+v", point, rep.Report.Quiesce)
			}
			sameValues(t, before, snapshot(t, s.db), "after an interrupt at "+point)
			if recorded(t, conn) != nil {
				t.Fatal("the quiesce is still recorded after the restore")
			}
			want := versions.SchemaBaseline
			if point == quiesce.PointApplied {
				want = versions.SchemaUpgraded
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
	testdb.SkipIfShort(t, "A crash at every step leaves the recorded state (status shows it); --resume-quiesce finishes the upgrade...")
	for _, point := range []string{quiesce.PointPaused, quiesce.PointDeprecated, quiesce.PointDrained, quiesce.PointApplied} {
		for _, finish := range []string{"resume", "undo"} {
			t.Run(point+"/"+finish, func(t *testing.T) {
				ctx := testCtx(t)
				s := newScene(t, false)
				before := snapshot(t, s.db)
				conn := testdb.Connect(t, s.db.DSN)
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
				info, err := quiesce.ReadInProgress(ctx, conn)
				if err != nil || info == nil || info.Next != "pgflow-upgrade apply --resume-quiesce --yes" || info.Functions != 4 || info.CronJobs != 4 {
					t.Fatalf("status after a crash at %s: %+v, %v", point, info, err)
				}
				// A second quiesce is refused while one is recorded.
				if res, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()}); !errors.Is(err, quiesce.ErrInProgress) || res.Outcome != outcome.Refused {
					t.Fatalf("a second apply --quiesce: %v", err)
				}
				want := versions.SchemaUpgraded
				if finish == "resume" {
					q := quiesceOpts()
					q.Resume = true
					rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q})
					if err != nil {
						t.Fatalf("--resume-quiesce after a crash at %s: %v", point, err)
					}
					if !rep.Report.Quiesce.Restored || rep.Report.Quiesce.ResumedFrom != quiesce.Phase(point) {
						t.Fatalf("resume report: %+v", rep.Report.Quiesce)
					}
					s.workersStoppedCleanly(t)
					nothingLost(t, s.db)
				} else {
					rep, err := quiesce.Undo(ctx, conn)
					if err != nil || !rep.Restored {
						t.Fatalf("--undo-quiesce after a crash at %s: %v %+v", point, err, rep)
					}
					if point != quiesce.PointApplied {
						want = versions.SchemaBaseline
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
	conn := testdb.Connect(t, s.db.DSN)
	q := quiesceOpts()
	q.DrainTimeout = 500 * time.Millisecond
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: q})
	if !errors.Is(err, quiesce.ErrDrainTimeout) || rep.Outcome != outcome.Refused {
		t.Fatalf("drain timeout: %v", err)
	}
	if !rep.Report.Quiesce.Restored || rep.Report.Quiesce.Applied {
		t.Fatalf("report: %+v", rep.Report.Quiesce)
	}
	sameValues(t, before, snapshot(t, s.db), "after a drain timeout")
	if st := state(t, conn); st != versions.SchemaBaseline {
		t.Fatalf("state %s after a drain timeout", st)
	}
	close(s.released)
}

// --dry-run changes nothing, and says what it would.
func TestQuiesceDryRun(t *testing.T) {
	ctx := testCtx(t)
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := testdb.Connect(t, s.db.DSN)
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{DryRun: true, LockRetries: 5, Quiesce: quiesceOpts()})
	if err != nil {
		t.Fatalf("apply --quiesce --dry-run: %v", err)
	}
	if rep.Outcome != outcome.DryRun || rep.Report.Quiesce == nil || len(rep.Report.Quiesce.Plan) < 8 {
		t.Fatalf("dry run: outcome %s, quiesce %+v", rep.Outcome, rep.Report.Quiesce)
	}
	inv := rep.Report.Quiesce.Inventory
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
	db.DropCron(t)
	db.Exec(t, `delete from pgflow.worker_functions`)
	conn := testdb.Connect(t, db.DSN)
	rep, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()})
	if err != nil {
		t.Fatalf("apply --quiesce without pg_cron and functions: %v", err)
	}
	if !rep.Report.Quiesce.Restored || len(rep.Report.Quiesce.Recorded) != 0 || state(t, conn) != versions.SchemaUpgraded {
		t.Fatalf("report: %s %+v", rep.Outcome, rep.Report.Quiesce)
	}
}

// pg_cron without cron.alter_job: the jobs are not paused by writing to
// cron.job; the quiesce refuses before changing anything.
func TestQuiesceNoAlterJob(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Baseline(t)
	db.DetachFromExtension(t, "pg_cron", `function cron.alter_job(bigint, text, text, text, text, boolean)`)
	db.Exec(t, `drop function cron.alter_job(bigint, text, text, text, text, boolean)`)
	before := snapshot(t, db)
	conn := testdb.Connect(t, db.DSN)
	res, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()})
	if !errors.Is(err, quiesce.ErrCronAPI) || res.Outcome != outcome.Refused {
		t.Fatalf("without cron.alter_job: %v", err)
	}
	sameValues(t, before, snapshot(t, db), "after the refusal")
	if recorded(t, conn) != nil || state(t, conn) != versions.SchemaBaseline {
		t.Fatal("the refusal changed something")
	}
}

// Ctrl-C while apply waits for a table lock (pgx cancels the query and
// closes the connection): the values are restored on a new connection.
func TestQuiesceInterruptedMidQuery(t *testing.T) {
	s := newScene(t, false)
	before := snapshot(t, s.db)
	conn := testdb.Connect(t, s.db.DSN)
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
	if rep.Outcome != outcome.Interrupted {
		t.Fatalf("interrupted while waiting for a lock: %v", err)
	}
	if !rep.Report.Quiesce.Restored {
		t.Fatalf("not restored: %v %+v", err, rep.Report.Quiesce)
	}
	t.Logf("apply's connection closed by the cancel: %v", conn.IsClosed())
	blocker.Rollback(context.Background())
	sameValues(t, before, snapshot(t, s.db), "after an interrupt mid-query")
	other := testdb.Connect(t, s.db.DSN)
	if recorded(t, other) != nil || state(t, other) != versions.SchemaBaseline {
		t.Fatal("still recorded, or upgraded")
	}
}

// A role that may not alter pgflow's cron jobs: pg_cron lets only a job's
// owner or a superuser alter it, and its row-level security shows a role
// only its own jobs. Either way the quiesce refuses before changing
// anything, naming the role to run as.
func TestQuiesceCronRoleMayNotAlter(t *testing.T) {
	for _, tc := range []struct {
		name, attrs, want string
		realOnly          bool
	}{
		{"sees every job (bypassrls)", "bypassrls", "belongs to role postgres", false},
		{"sees only its own jobs", "", "sees only the pg_cron jobs it owns", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.realOnly {
				testdb.RequireRealCron(t) // the stand-in has no row-level security
			}
			ctx := testCtx(t)
			db := testdb.Baseline(t)
			role, roleDSN := db.LoginRole(t, "q_cron_role", tc.attrs,
				`grant usage on schema pgflow, pgmq, cron to %[1]s`,
				`grant select on all tables in schema pgflow, pgmq, cron to %[1]s`,
				`grant create on database `+pgx.Identifier{db.Name}.Sanitize()+` to %[1]s`)
			before := snapshot(t, db)
			stateBefore := testdb.State(t, db.Pool)
			conn := testdb.Connect(t, roleDSN)
			defer conn.Close(context.Background())
			res, err := upgrade.Apply(ctx, conn, upgrade.Options{Quiesce: quiesceOpts()})
			if !errors.Is(err, quiesce.ErrCronAPI) || res.Outcome != outcome.Refused {
				t.Fatalf("apply --quiesce as %s: %v", role, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("refusal %q does not say %q", err, tc.want)
			}
			sameValues(t, before, snapshot(t, db), "after the refusal")
			testdb.SameState(t, stateBefore, testdb.State(t, db.Pool), "after the refusal")
		})
	}
}

// On the real pg_cron the quiesce pauses and restores through the
// extension's own cron.alter_job (the jobs are rows of the extension's
// table, which pg_cron's trigger watches).
func TestQuiesceRealCronAlterJob(t *testing.T) {
	testdb.RequireRealCron(t)
	s := newScene(t, false)
	var member bool
	if err := s.db.Pool.QueryRow(context.Background(), `
		select exists (select 1 from pg_catalog.pg_depend d join pg_catalog.pg_extension e on e.oid = d.refobjid
		                where e.extname = 'pg_cron' and d.classid = 'pg_catalog.pg_proc'::regclass
		                  and d.objid = 'cron.alter_job(bigint, text, text, text, text, boolean)'::regprocedure)`).Scan(&member); err != nil || !member {
		t.Fatalf("cron.alter_job is not the extension's (%v)", err)
	}
	before := snapshot(t, s.db)
	conn := testdb.Connect(t, s.db.DSN)
	rep, err := upgrade.Apply(testCtx(t), conn, upgrade.Options{Quiesce: quiesceOpts()})
	if err != nil || !rep.Report.Quiesce.Restored {
		t.Fatalf("apply --quiesce on the real pg_cron: %v", err)
	}
	sameValues(t, before, snapshot(t, s.db), "after apply --quiesce")
	if !before.Jobs[jobKey(t, s.db, "other_db_requeue")] || before.Jobs[jobKey(t, s.db, "pgflow_cleanup_logs")] {
		t.Fatalf("scene: the other database's job should be active and cleanup_logs paused: %v", before.Jobs)
	}
}

func jobKey(t *testing.T, db *testdb.DB, name string) string {
	t.Helper()
	var k string
	if err := db.Pool.QueryRow(context.Background(), `select jobid || ' ' || jobname from cron.job where jobname = $1`, name).Scan(&k); err != nil {
		t.Fatalf("job %s: %v", name, err)
	}
	return k
}
