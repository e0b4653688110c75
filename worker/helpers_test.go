package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// hangGuard only stops a broken test from hanging; no assertion depends on it.
const hangGuard = 2 * time.Minute

// upgraded returns a fresh pgflow 0.16.0 database (testdb.Baseline) with the
// embedded migration to 0.17.0 applied in one transaction.
func upgraded(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	migrate(t, db)
	return db
}

// migrate applies the embedded migrations in one transaction.
func migrate(t *testing.T, db *testdb.DB) {
	t.Helper()
	testdb.Migrate(t, db.Pool)
}

func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("WORKER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// events fans the OnResult callbacks of any number of workers into one
// channel, so tests wait on signals instead of sleeping.
type events struct {
	ch chan worker.Result
}

func newEvents() *events { return &events{ch: make(chan worker.Result, 100000)} }

func (e *events) onResult(r worker.Result) { e.ch <- r }

// waitUntil re-checks cond after every task outcome until it holds.
func (e *events) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	guard := time.NewTimer(hangGuard)
	defer guard.Stop()
	for !cond() {
		select {
		case <-e.ch:
		case <-guard.C:
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// recv waits for one signal.
func recv[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("gave up waiting for %s", what)
		panic("unreachable")
	}
}

// start creates and starts a worker that is stopped gracefully when the test ends.
func start(t *testing.T, pool *pgxpool.Pool, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	w, err := worker.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("stopping worker: %v", err)
		}
	})
	return w
}

// stopNow stops w gracefully (its cleanup's Stop is then a no-op): its
// counters are final only once its last outcome was written and counted.
func stopNow(t *testing.T, w *worker.Worker) {
	t.Helper()
	if err := w.Stop(context.Background()); err != nil {
		t.Fatalf("stopping worker: %v", err)
	}
}

// startN starts n workers with the same config (each its own id) and stops
// them concurrently when the test ends (each Stop may wait for a claim's
// server-side poll).
func startN(t *testing.T, pool *pgxpool.Pool, n int, cfg worker.Config) []*worker.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	var ws []*worker.Worker
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Go(func() {
				if err := w.Stop(context.Background()); err != nil {
					t.Errorf("stopping worker: %v", err)
				}
			})
		}
		wg.Wait()
	})
	for range n {
		w, err := worker.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	return ws
}

func startRun(t *testing.T, pool *pgxpool.Pool, flow string, input any) string {
	t.Helper()
	b, err := json.Marshal(input)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	if err := pool.QueryRow(context.Background(), `select run_id::text from pgflow.start_flow($1, $2::jsonb)`, flow, string(b)).Scan(&id); err != nil {
		t.Fatalf("start_flow %s: %v", flow, err)
	}
	return id
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func runStatus(t *testing.T, pool *pgxpool.Pool, runID string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `select status from pgflow.runs where run_id = $1::uuid`, runID).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// counter counts handler executions per task.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func newCounter() *counter { return &counter{n: map[string]int{}} }

func (c *counter) add(t *worker.Task) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[fmt.Sprintf("%s/%s/%d", t.RunID, t.StepSlug, t.TaskIndex)]++
}

func (c *counter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// assertEachTaskOnce checks that every task of the database ran successfully
// exactly once (per the handlers' own count) and is completed in the engine.
func assertEachTaskOnce(t *testing.T, pool *pgxpool.Pool, success *counter, wantTasks int) {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`select run_id::text || '/' || step_slug || '/' || task_index, status from pgflow.step_tasks`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := success.snapshot()
	seen := 0
	for rows.Next() {
		var key, status string
		if err := rows.Scan(&key, &status); err != nil {
			t.Fatal(err)
		}
		seen++
		if status != "completed" {
			t.Errorf("task %s is %s", key, status)
		}
		if got[key] != 1 {
			t.Errorf("task %s completed by a handler %d times", key, got[key])
		}
		delete(got, key)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != wantTasks {
		t.Errorf("%d tasks in the database, want %d", seen, wantTasks)
	}
	for k := range got {
		t.Errorf("handler ran for %s, which is not a task", k)
	}
}

// withHandlers returns cfg with h as the handler of every step (nil: a
// no-op) and the test's logger.
func withHandlers(cfg worker.Config, h worker.HandlerFunc) worker.Config {
	if h == nil {
		h = func(context.Context, *worker.Task) (any, error) { return nil, nil }
	}
	cfg.Handlers = map[string]worker.HandlerFunc{}
	for _, s := range cfg.Flow.Steps {
		cfg.Handlers[s.Slug] = h
	}
	return cfg
}
