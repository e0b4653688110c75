package scenario

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// traffic is application sessions calling start_flow and complete_task on
// the legacy flow, each with lock_timeout 2s, measuring every call.
type traffic struct {
	db   *DB
	stop atomic.Bool // set by halt; sessions finish their call and return

	mu        sync.Mutex
	pending   []string // runs whose task a is started and not yet completed
	completed []string
	started   int
	nOps      int
	nTimeouts int
	// nStale: complete_task calls that were already running (parsed, their
	// result row type fixed) when the upgrade changed step_tasks' row type,
	// and failed with 42804 when they went on. Such a call rolls back whole,
	// so the application retries it; it counts as a loud error, not a loss.
	nStale   int
	maxWait  time.Duration
	failures []string
}

const trafficLockTimeout = "2s"

func newTraffic(db *DB, startedTasks []string) *traffic {
	return &traffic{db: db, pending: append([]string(nil), startedTasks...)}
}

// halt asks the sessions to stop after their current call (a call is never
// cut off, so every call that committed is counted).
func (t *traffic) halt() { t.stop.Store(true) }

// start runs n sessions until halt (or ctx ends); the channel closes when
// all stopped.
func (t *traffic) start(ctx context.Context, n int) <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.session(ctx, i)
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

func (t *traffic) session(ctx context.Context, id int) {
	// The application's session, on purpose not pinned: the traffic
	// connects as the application does, and pgflow's functions name their
	// own schemas. The simple protocol: no prepared statement outlives the
	// DDL.
	conn, err := session.OpenWith(ctx, t.db.DSN, session.Options{Purpose: session.Application,
		Name:     fmt.Sprintf("replay app session %d", id),
		Settings: map[string]string{"lock_timeout": trafficLockTimeout},
		ExecMode: pgx.QueryExecModeSimpleProtocol})
	if errors.Is(err, session.ErrMalformed) {
		t.fail(fmt.Sprintf("session %d: %v", id, err))
		return
	}
	if err != nil {
		t.fail(fmt.Sprintf("session %d: connecting: %v", id, err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i := 0; ctx.Err() == nil && !t.stop.Load(); i++ {
		var run string
		if i%2 == 1 {
			t.mu.Lock()
			if len(t.pending) > 0 {
				run = t.pending[0]
				t.pending = t.pending[1:]
			}
			t.mu.Unlock()
		}
		begin := time.Now()
		var err error
		if run != "" {
			_, err = conn.Exec(ctx, `select count(*) from pgflow.complete_task($1::uuid, 'a', 0, '{"app": true}'::jsonb)`, run)
		} else {
			_, err = conn.Exec(ctx, `select count(*) from pgflow.start_flow('legacy', $1::jsonb)`, fmt.Sprintf(`{"session": %d, "op": %d}`, id, i))
		}
		took := time.Since(begin)
		if ctx.Err() != nil {
			if run != "" && err != nil {
				t.requeue(run)
			}
			return
		}
		t.mu.Lock()
		t.nOps++
		if took > t.maxWait {
			t.maxWait = took
		}
		switch code := SQLState(err); {
		case err == nil && run != "":
			t.completed = append(t.completed, run)
		case err == nil:
			t.started++
		case code == "55P03": // lock_timeout: bounded, the app retries
			t.nTimeouts++
			if run != "" {
				t.pending = append(t.pending, run)
			}
		case code == "42804" && run != "":
			t.nStale++
			t.pending = append(t.pending, run)
		case code == "40P01":
			t.failures = append(t.failures, fmt.Sprintf("DEADLOCK in session %d (%s): %v (%s)", id, opName(run), err, pgDetail(err)))
		default:
			t.failures = append(t.failures, fmt.Sprintf("session %d (%s): %v", id, opName(run), err))
		}
		t.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

func (t *traffic) requeue(run string) {
	t.mu.Lock()
	t.pending = append(t.pending, run)
	t.mu.Unlock()
}

func (t *traffic) fail(msg string) {
	t.mu.Lock()
	t.failures = append(t.failures, msg)
	t.mu.Unlock()
}

// waitOps waits until n more calls succeeded.
func (t *traffic) waitOps(ctx context.Context, n int) {
	t.mu.Lock()
	target := t.started + len(t.completed) + n
	t.mu.Unlock()
	_ = waitFor(ctx, 20*time.Second, func() (bool, error) {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.started+len(t.completed) >= target || len(t.failures) > 0, nil
	})
}

func (t *traffic) check() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.failures) > 0 {
		return errors.New("application traffic during apply failed: " + strings.Join(t.failures, "; "))
	}
	if t.started == 0 {
		return errors.New("no start_flow of the application traffic succeeded")
	}
	return nil
}

func (t *traffic) startedRuns() int { t.mu.Lock(); defer t.mu.Unlock(); return t.started }
func (t *traffic) ops() int         { t.mu.Lock(); defer t.mu.Unlock(); return t.nOps }
func (t *traffic) timeouts() int    { t.mu.Lock(); defer t.mu.Unlock(); return t.nTimeouts }
func (t *traffic) stale() int       { t.mu.Lock(); defer t.mu.Unlock(); return t.nStale }
func (t *traffic) longest() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxWait
}
func (t *traffic) completedTasks() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.completed...)
}

func opName(run string) string {
	if run == "" {
		return "start_flow"
	}
	return "complete_task"
}

func pgDetail(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Detail
	}
	return ""
}

// concurrentTraffic runs application sessions during apply.
func concurrentTraffic(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	const preRuns = 12
	tasks, err := startLegacyTasks(ctx, db, preRuns)
	if err != nil {
		return err
	}

	tr := newTraffic(db, tasks)
	// A session in the middle of a start_flow transaction when apply begins:
	// apply must wait for it (bounded), and it must be able to commit.
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := holder.Exec(ctx, `select count(*) from pgflow.start_flow('legacy', '{"holder": true}'::jsonb)`); err != nil {
		_ = holder.Rollback(ctx)
		return err
	}
	trafficDone := tr.start(ctx, 4)
	ap := startApplyUnderTraffic(ctx, env, db)
	holderErr := commitHolderBehindApply(ctx, db, holder, ap)
	upErr := <-ap.done
	// Traffic keeps going a little after the upgrade, on the new schema.
	tr.waitOps(ctx, 8)
	tr.halt()
	<-trafficDone
	if upErr != nil {
		// What the sessions saw (a deadlock, a failure) says why apply could
		// not get its locks.
		if terr := tr.check(); terr != nil {
			return fmt.Errorf("apply under traffic: %w; meanwhile %v (longest application wait %s over %d ops)", upErr, terr, tr.longest().Round(time.Millisecond), tr.ops())
		}
		return fmt.Errorf("apply under traffic: %w (longest application wait %s over %d ops, %d lock timeouts)", upErr, tr.longest().Round(time.Millisecond), tr.ops(), tr.timeouts())
	}
	if holderErr != nil {
		return fmt.Errorf("waiting for apply to queue behind an open transaction: %w", holderErr)
	}
	if err := tr.check(); err != nil {
		return err
	}
	if err := checkTrafficWrites(ctx, db, tr, preRuns); err != nil {
		return err
	}
	lockWindow := int64(0)
	attempts := 0
	if ap.rep != nil {
		lockWindow, attempts = ap.rep.Report.LockWindowMS, ap.rep.Report.LockAttempts
	}
	env.Notef("longest application wait %s over %d ops (%d lock timeouts, %d calls in flight across the row-type change failed with 42804 and were retried); apply lock window %d ms, %d lock attempts in its last of %d run(s)",
		tr.longest().Round(time.Millisecond), tr.ops(), tr.timeouts(), tr.stale(), lockWindow, attempts, ap.runs)
	return nil
}

// startLegacyTasks starts n runs of the legacy flow and every task a of
// them (as a 0.16.0 worker would), so the application has complete_task
// work during the upgrade. It returns the runs' ids.
func startLegacyTasks(ctx context.Context, db *DB, n int) ([]string, error) {
	if err := startLegacy(ctx, db, n); err != nil {
		return nil, err
	}
	wid := oldworker.NewID()
	if _, err := db.Pool.Exec(ctx, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'legacy', 'app')`, wid); err != nil {
		return nil, err
	}
	rows, err := db.Pool.Query(ctx, `select run_id::text from pgflow.start_tasks('legacy',
		array(select msg_id from pgmq.read('legacy', 60, 100)), $1::uuid) order by run_id`, wid)
	if err != nil {
		return nil, err
	}
	tasks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(tasks) != n {
		return nil, errorf("started %d tasks, want %d", len(tasks), n)
	}
	return tasks, nil
}

// applyUnderTraffic is the upgrade running beside the traffic. rep and runs
// are read once done has delivered its error.
type applyUnderTraffic struct {
	done     chan error
	finished atomic.Bool // set before done is sent to
	rep      *upgrade.Result[*upgrade.Report]
	runs     int // apply runs made, the last one reported
}

// startApplyUnderTraffic runs the upgrade in its own goroutine. An apply
// that gives up on its table locks (bounded: lock_busy, nothing changed) is
// rerun, as an operator would: under load the traffic can hold pgflow.steps
// in the middle of a statement at each of its attempts.
func startApplyUnderTraffic(ctx context.Context, env *Env, db *DB) *applyUnderTraffic {
	const maxApplyRuns = 3
	ap := &applyUnderTraffic{done: make(chan error, 1)}
	go func() {
		var err error
		for ap.runs = 1; ; ap.runs++ {
			var busy *upgrade.TableLockError
			ap.rep, err = env.Upgrade(ctx, db)
			if err == nil || !errors.As(err, &busy) || ap.runs == maxApplyRuns {
				break
			}
			env.Logf("replay: concurrent-traffic: apply run %d gave up on its table locks (nothing changed), running it again", ap.runs)
		}
		ap.finished.Store(true)
		ap.done <- err
	}()
	return ap
}

// commitHolderBehindApply commits the holder once apply is queued behind it
// (or apply gave up).
func commitHolderBehindApply(ctx context.Context, db *DB, holder pgx.Tx, ap *applyUnderTraffic) error {
	holderErr := waitFor(ctx, 20*time.Second, func() (bool, error) {
		if ap.finished.Load() {
			return true, nil
		}
		n, err := CountRows(ctx, db, `select count(*) from pg_catalog.pg_locks l
			where not l.granted and l.locktype = 'relation' and l.database = (select oid from pg_catalog.pg_database where datname = current_database())`)
		return n > 0, err
	})
	if err := holder.Commit(ctx); err != nil && holderErr == nil {
		holderErr = fmt.Errorf("the session that held locks when apply started could not commit: %w", err)
	}
	return holderErr
}

// checkTrafficWrites checks that every write the traffic committed is
// there, with the right queue_name.
func checkTrafficWrites(ctx context.Context, db *DB, tr *traffic, preRuns int) error {
	if d, err := fingerprint.CheckNewColumns(ctx, db.Pool); err != nil || len(d) > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("new columns wrong after apply under traffic:\n%s", fingerprint.Format(d, 20))
	}
	started, err := CountRows(ctx, db, `select count(*) from pgflow.runs`)
	if err != nil {
		return err
	}
	if want := preRuns + 1 + tr.startedRuns(); started != want {
		return errorf("%d runs after apply, want %d (%d before, 1 holder, %d started by the traffic)", started, want, preRuns, tr.startedRuns())
	}
	for _, run := range tr.completedTasks() {
		n, err := CountRows(ctx, db, `select count(*) from pgflow.step_tasks where run_id = $1::uuid and step_slug = 'a' and status = 'completed'`, run)
		if err != nil {
			return err
		}
		if n != 1 {
			return errorf("task a of run %s was completed by the application but is not completed", run)
		}
	}
	return nil
}
