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
	cfg, err := pgx.ParseConfig(t.db.DSN)
	if err != nil {
		t.fail(fmt.Sprintf("session %d: %v", id, err))
		return
	}
	cfg.RuntimeParams["application_name"] = fmt.Sprintf("replay app session %d", id)
	cfg.RuntimeParams["lock_timeout"] = trafficLockTimeout
	// The simple protocol: no prepared statement outlives the DDL.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
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
		switch code := pgCode(err); {
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
