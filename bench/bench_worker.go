package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// worker: tasks per second claimed and completed with no-op handlers, the Go
// pgflow 0.17 worker (package worker on a database upgraded to 0.17.0:
// read_with_poll + 5-argument start_tasks + complete_task) against the 0.16.0
// path (fixtures/oldworker on a baseline database: read_with_poll + 3-argument
// start_tasks + complete_task), in one run, at 1, 4 and 16 workers.
//
// Method (BENCHMARKS.md repeats it):
//   - every measurement gets a fresh database: a clone of the real pgflow
//     0.16.0 engine, upgraded to 0.17.0 with the embedded migration (one
//     transaction) for the new worker;
//   - the flow is compiled, then all workers start (each its own pool) and
//     poll the empty queue; only then is the whole workload enqueued in one
//     transaction, so every message becomes visible at its commit;
//   - the clock runs from that commit (the first claim follows within one poll
//     interval, 10 ms on both paths) to the last complete_task's completed_at,
//     both read from the server's clock;
//   - same batch size, concurrency, visibility timeout and polling on both
//     paths; cases alternate old/new (the order flips every repetition) so a
//     drift in machine load hits both; the median of env.Repeat is reported;
//   - each measurement is checked: every task completed, on its first
//     attempt, every run completed (exactly once), no worker error.
func init() {
	Register(Benchmark{
		Name: "worker",
		Goal: "the 0.17 Go worker on 0.17.0 at least as many tasks/s as the 0.16.0 worker simulator on 0.16.0 at 1, 4 and 16 workers",
		Run:  benchWorker,
	})
}

// Per-worker settings, identical on both paths.
const (
	wbBatchSize    = 10
	wbConcurrency  = 10
	wbPoolConns    = wbConcurrency + 2 // handlers' completions + the claim + the heartbeat
	wbVisibility   = 60                // seconds: no lease expires during a measurement
	wbPollSeconds  = 2
	wbPollInterval = 10 * time.Millisecond
)

var wbWorkerCounts = []int{1, 4, 16}

// workerShape is one workload.
type workerShape struct {
	Name        string
	Map         bool // one root map step; else one root single step
	Runs        int
	TasksPerRun int // map only (single: 1)
}

func (s workerShape) tasks() int {
	if s.Map {
		return s.Runs * s.TasksPerRun
	}
	return s.Runs
}

// Both shapes are 10,000 tasks: a few big runs (every completion of a run
// locks the same run row) and many small ones (claims spread over 10,000
// runs, each completion also completes its run).
var workerShapes = []workerShape{
	{Name: "root map, 20 runs x 500 tasks", Map: true, Runs: 20, TasksPerRun: 500},
	{Name: "single step, 10000 runs", Map: false, Runs: 10000},
}

type protocol string

const (
	protoOld protocol = "0.16.0 read_with_poll+start_tasks"
	protoNew protocol = "0.17.0 worker (package worker)"
)

const wbFlowSlug = "bench_worker"

func (s workerShape) newFlow() worker.Flow {
	st := worker.Step{Slug: "work", Type: worker.StepSingle}
	if s.Map {
		st.Type = worker.StepMap
	}
	return worker.Flow{Slug: wbFlowSlug, Steps: []worker.Step{st}}
}

func (s workerShape) oldFlow() oldworker.Flow {
	st := oldworker.Step{Slug: "work", Type: "single"}
	if s.Map {
		st.Type = "map"
	}
	return oldworker.Flow{Slug: wbFlowSlug, Steps: []oldworker.Step{st}}
}

// workerSample is one measurement.
type workerSample struct {
	Elapsed     time.Duration
	Tasks       int
	ExtraReads  int64   // sum(read_ct) - messages: reads that did not end in a claim
	ClaimCalls  int64   // new worker: start_tasks calls that returned
	ClaimedMean float64 // new worker: tasks per start_tasks call
	// ServerCPU is the CPU time the workers' backends used between the
	// enqueue commit and the last completion, RunQueue the time they waited
	// for a CPU (from /proc/<pid>/schedstat; 0 when the server is not local).
	// Less sensitive to other load on the machine than the wall time.
	ServerCPU, RunQueue time.Duration
	// ClientCPU is this process's CPU time over the same interval: the
	// workers' Go side (plus the benchmark's own 20 ms progress query, the
	// same on both paths). It competes with the server for the same cores
	// when both run on one machine.
	ClientCPU time.Duration
}

func (s workerSample) rate() float64 { return float64(s.Tasks) / s.Elapsed.Seconds() }

func benchWorker(ctx context.Context, env *Env) ([]Row, error) {
	shapes, counts, err := wbSelection()
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, shape := range shapes {
		samples := map[protocol]map[int][]workerSample{protoOld: {}, protoNew: {}}
		for i := 0; i < env.Repeat; i++ {
			for _, n := range counts {
				order := []protocol{protoOld, protoNew}
				if i%2 == 1 {
					order = []protocol{protoNew, protoOld}
				}
				for _, p := range order {
					s, err := measureWorkers(ctx, env, p, shape, n)
					if err != nil {
						return nil, fmt.Errorf("%s, %s, %d workers: %w", shape.Name, p, n, err)
					}
					env.Logf("bench: worker: %s, %s, %d workers: %.0f tasks/s (%s, extra reads %d, tasks/claim %.2f, server CPU %s = %.3f ms/task, run queue %s, client CPU %.3f ms/task)",
						shape.Name, p, n, s.rate(), s.Elapsed.Round(time.Millisecond), s.ExtraReads, s.ClaimedMean,
						s.ServerCPU.Round(time.Millisecond), cpuPerTask(s), s.RunQueue.Round(time.Millisecond), perTask(s.ClientCPU, s))
					samples[p][n] = append(samples[p][n], s)
				}
			}
		}
		for _, n := range counts {
			o, nw := medianSample(samples[protoOld][n]), medianSample(samples[protoNew][n])
			rows = append(rows, Row{Benchmark: "worker", Case: fmt.Sprintf("%s, %d worker(s) x %d concurrency, batch %d", shape.Name, n, wbConcurrency, wbBatchSize),
				Metrics: []Metric{
					{"0.16.0", o.rate() / 1000, "k tasks/s"},
					{"0.17.0", nw.rate() / 1000, "k tasks/s"},
					{"new/old", nw.rate() / o.rate(), "x"},
					{"extra reads old", float64(o.ExtraReads), ""},
					{"extra reads new", float64(nw.ExtraReads), ""},
					{"tasks per claim new", nw.ClaimedMean, ""},
					{"server CPU/task old", cpuPerTask(o), "ms"},
					{"server CPU/task new", cpuPerTask(nw), "ms"},
					{"client CPU/task old", perTask(o.ClientCPU, o), "ms"},
					{"client CPU/task new", perTask(nw.ClientCPU, nw), "ms"},
				}})
		}
	}
	return rows, nil
}

// wbSelection narrows a diagnostic run: PGFLOW_BENCH_WORKER_SHAPES ("map",
// "single" or both, comma separated) and PGFLOW_BENCH_WORKER_COUNTS (e.g.
// "4,16"). Unset: every shape at 1, 4 and 16 workers (the headline numbers).
func wbSelection() ([]workerShape, []int, error) {
	shapes, counts := workerShapes, wbWorkerCounts
	if v := os.Getenv("PGFLOW_BENCH_WORKER_SHAPES"); v != "" {
		shapes = nil
		for _, name := range strings.Split(v, ",") {
			switch strings.TrimSpace(name) {
			case "map":
				shapes = append(shapes, workerShapes[0])
			case "single":
				shapes = append(shapes, workerShapes[1])
			default:
				return nil, nil, fmt.Errorf("PGFLOW_BENCH_WORKER_SHAPES: unknown shape %q (map, single)", name)
			}
		}
	}
	if v := os.Getenv("PGFLOW_BENCH_WORKER_COUNTS"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return nil, nil, fmt.Errorf("PGFLOW_BENCH_WORKER_COUNTS: %q is not a positive worker count", f)
			}
			counts = append(counts, n)
		}
	}
	return shapes, counts, nil
}

func cpuPerTask(s workerSample) float64 { return perTask(s.ServerCPU, s) }

func perTask(d time.Duration, s workerSample) float64 {
	return float64(d) / float64(time.Millisecond) / float64(s.Tasks)
}

// processCPU is this process's user + system CPU time so far (0 where
// getrusage is not available).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// medianSample is the sample of median throughput.
func medianSample(ss []workerSample) workerSample {
	s := append([]workerSample(nil), ss...)
	sort.Slice(s, func(i, j int) bool { return s[i].rate() < s[j].rate() })
	return s[len(s)/2]
}

// measureWorkers runs one measurement on a fresh database.
func measureWorkers(ctx context.Context, env *Env, p protocol, shape workerShape, n int) (workerSample, error) {
	dsn, drop, err := env.CloneBaseline(ctx)
	if err != nil {
		return workerSample{}, err
	}
	defer drop()
	admin, err := session.Open(ctx, dsn, session.Admin)
	if err != nil {
		return workerSample{}, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if err := prepareWorkerBench(ctx, admin, p, shape); err != nil {
		return workerSample{}, err
	}

	ws, err := startBenchWorkers(ctx, p, shape, dsn, n)
	if err != nil {
		return workerSample{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = ws.stop()
		}
	}()

	if err := enqueueBenchRuns(ctx, admin, shape); err != nil {
		return workerSample{}, err
	}
	var t0 time.Time
	if err := admin.QueryRow(ctx, `select clock_timestamp()`).Scan(&t0); err != nil {
		return workerSample{}, err
	}
	cpu0 := backendCPU(ctx, admin)
	client0 := processCPU()

	var s workerSample
	if err := waitForBenchRuns(ctx, admin, ws); err != nil {
		return workerSample{}, err
	}
	cpu1 := backendCPU(ctx, admin)
	s.ClientCPU = processCPU() - client0
	stopped = true
	if err := ws.stop(); err != nil {
		return workerSample{}, err
	}

	totals, err := readBenchTotals(ctx, admin, shape)
	if err != nil {
		return workerSample{}, err
	}
	if wbTrackFunctions() {
		logFunctionStats(ctx, env, admin, fmt.Sprintf("%s, %s, %d workers", shape.Name, p, n))
	}
	s.Elapsed = totals.end.Sub(t0)
	s.Tasks = int(totals.tasks)
	s.ExtraReads = totals.reads - totals.archived
	s.ClaimCalls, s.ClaimedMean = ws.claimStats()
	if cpu0 != nil && cpu1 != nil {
		for pid, c := range cpu1 {
			s.ServerCPU += c.run - cpu0[pid].run
			s.RunQueue += c.queued - cpu0[pid].queued
		}
	}
	if ws.completed() != -1 && ws.completed() != totals.tasks {
		return workerSample{}, fmt.Errorf("workers counted %d completions, want %d", ws.completed(), totals.tasks)
	}
	return s, nil
}

// prepareWorkerBench readies a fresh baseline database for protocol p: the
// upgrade and the flow compiled through the new worker, or the flow compiled
// as a 0.16.0 worker does.
func prepareWorkerBench(ctx context.Context, admin *pgx.Conn, p protocol, shape workerShape) error {
	if p == protoNew {
		if err := applyMigrations(ctx, admin); err != nil {
			return err
		}
		if err := applyProposal(ctx, admin); err != nil {
			return err
		}
		if _, err := worker.EnsureFlow(ctx, admin, shape.newFlow()); err != nil {
			return fmt.Errorf("compiling the bench flow: %w", err)
		}
	} else {
		if _, err := admin.Exec(ctx, `select pgflow.ensure_flow_compiled($1::text, $2::jsonb)`, wbFlowSlug, string(shape.oldFlow().MustShape())); err != nil {
			return fmt.Errorf("compiling the bench flow: %w", err)
		}
	}
	// Fresh statistics, so the planner sees the empty tables as they are.
	if _, err := admin.Exec(ctx, "analyze"); err != nil {
		return err
	}
	return nil
}

// enqueueBenchRuns starts every run in one transaction: the messages become
// visible at its commit, which starts the clock. (The map input refers to r
// so that start_flow is called once per row, not once and rescanned.)
func enqueueBenchRuns(ctx context.Context, admin *pgx.Conn, shape workerShape) error {
	tx, err := admin.Begin(ctx)
	if err != nil {
		return err
	}
	if shape.Map {
		_, err = tx.Exec(ctx, `select count(*) from generate_series(1, $2::int) r,
		    lateral pgflow.start_flow($1::text, (select jsonb_agg(i) from generate_series(1, $3::int) i where r > 0))`,
			wbFlowSlug, shape.Runs, shape.TasksPerRun)
	} else {
		_, err = tx.Exec(ctx, `select count(*) from generate_series(1, $2::int) r,
		    lateral pgflow.start_flow($1::text, jsonb_build_object('run', r))`, wbFlowSlug, shape.Runs)
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return fmt.Errorf("starting %d runs: %w", shape.Runs, err)
	}
	return tx.Commit(ctx)
}

// waitForBenchRuns waits for the last run to complete. Its 10-minute limit
// is a guard, never part of the result.
func waitForBenchRuns(ctx context.Context, admin *pgx.Conn, ws *benchWorkers) error {
	guard := time.Now().Add(10 * time.Minute)
	for {
		var open int64
		if err := admin.QueryRow(ctx, `select count(*) from pgflow.runs where status <> 'completed'`).Scan(&open); err != nil {
			return err
		}
		if open == 0 {
			return nil
		}
		if err := ws.err(); err != nil {
			return fmt.Errorf("a worker stopped with %d runs open: %w", open, err)
		}
		if time.Now().After(guard) {
			return fmt.Errorf("gave up: %d runs still open after 10 minutes", open)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// benchTotals are a finished measurement's counts, read from its database.
type benchTotals struct {
	end      time.Time // the last task's completed_at
	tasks    int64
	reads    int64 // pgmq reads of the archived messages
	archived int64
}

// readBenchTotals reads the totals and checks that every task completed on
// its first attempt and every message was archived.
func readBenchTotals(ctx context.Context, admin *pgx.Conn, shape workerShape) (benchTotals, error) {
	var t benchTotals
	var completedOnce int64
	if err := admin.QueryRow(ctx, `select max(completed_at), count(*),
	        count(*) filter (where status = 'completed' and attempts_count = 1)
	      from pgflow.step_tasks`).Scan(&t.end, &t.tasks, &completedOnce); err != nil {
		return benchTotals{}, err
	}
	if t.tasks != int64(shape.tasks()) || completedOnce != t.tasks {
		return benchTotals{}, fmt.Errorf("%d tasks, %d completed on their first attempt; want %d each", t.tasks, completedOnce, shape.tasks())
	}
	if err := admin.QueryRow(ctx, `select coalesce(sum(read_ct), 0), count(*) from pgmq.`+pgx.Identifier{"a_" + wbFlowSlug}.Sanitize()).
		Scan(&t.reads, &t.archived); err != nil {
		return benchTotals{}, fmt.Errorf("reading the archive: %w", err)
	}
	if t.archived != t.tasks {
		return benchTotals{}, fmt.Errorf("%d messages archived, want %d", t.archived, t.tasks)
	}
	return t, nil
}

// wbClaimLinger: the new workers' ClaimLinger, the worker's default unless
// PGFLOW_BENCH_WORKER_LINGER (a Go duration, or "off") says otherwise (a
// diagnostic: the headline numbers use the default).
func wbClaimLinger() time.Duration {
	switch v := os.Getenv("PGFLOW_BENCH_WORKER_LINGER"); v {
	case "":
		return 0
	case "off":
		return worker.NoClaimLinger
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0
		}
		return d
	}
}

type schedStat struct{ run, queued time.Duration }

// backendCPU reads /proc/<pid>/schedstat of every other backend of conn's
// database; nil when the server's processes are not visible here (a remote or
// containerized server).
func backendCPU(ctx context.Context, conn *pgx.Conn) map[int]schedStat {
	rows, err := conn.Query(ctx, `select pid from pg_catalog.pg_stat_activity
	    where datname = pg_catalog.current_database() and pid <> pg_catalog.pg_backend_pid()`)
	if err != nil {
		return nil
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil
	}
	out := map[int]schedStat{}
	for _, pid := range pids {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmd), "postgres") {
			return nil
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			return nil
		}
		var run, queued int64
		if _, err := fmt.Sscan(string(b), &run, &queued); err != nil {
			return nil
		}
		out[int(pid)] = schedStat{time.Duration(run), time.Duration(queued)}
	}
	return out
}

// wbTrackFunctions: PGFLOW_BENCH_WORKER_TRACK=1 turns on track_functions in
// the workers' sessions (superuser only) and logs the server time per
// function after each measurement. A diagnostic: it adds overhead, so results
// measured with it are not the headline numbers.
func wbTrackFunctions() bool { return os.Getenv("PGFLOW_BENCH_WORKER_TRACK") == "1" }

func logFunctionStats(ctx context.Context, env *Env, conn *pgx.Conn, what string) {
	// Workers' sessions flushed their counters when their pools closed.
	rows, err := conn.Query(ctx, `select schemaname || '.' || funcname, calls, total_time, self_time
	    from pg_catalog.pg_stat_user_functions where schemaname in ('pgflow', 'pgmq') order by total_time desc limit 12`)
	if err != nil {
		env.Logf("bench: worker: function stats: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var calls int64
		var total, self float64
		if err := rows.Scan(&name, &calls, &total, &self); err != nil {
			env.Logf("bench: worker: function stats: %v", err)
			return
		}
		env.Logf("bench: worker: %s: %-40s calls %7d total %9.0f ms self %9.0f ms (%.3f ms/call)", what, name, calls, total, self, total/float64(max(calls, 1)))
	}
}

// applyProposal runs the SQL file named by PGFLOW_BENCH_WORKER_SQL after the
// migration (upgraded databases only): how a proposed change to start_tasks or
// complete_task is measured in this benchmark before it goes into the
// migration. Results measured with it say so in the log.
func applyProposal(ctx context.Context, conn *pgx.Conn) error {
	path := os.Getenv("PGFLOW_BENCH_WORKER_SQL")
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading PGFLOW_BENCH_WORKER_SQL: %w", err)
	}
	if _, err := conn.Exec(ctx, string(b)); err != nil {
		return fmt.Errorf("applying PGFLOW_BENCH_WORKER_SQL %s: %w", path, err)
	}
	return nil
}

// applyMigrations upgrades the database the way the worker tests do: every
// embedded migration in one transaction.
func applyMigrations(ctx context.Context, conn *pgx.Conn) error {
	all, err := migrations.All()
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, m := range all {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("applying %s: %w", m.File, err)
		}
	}
	return tx.Commit(ctx)
}

// benchWorkers is a set of running workers of one protocol.
type benchWorkers struct {
	pools []*pgxpool.Pool
	news  []*worker.Worker
	// old workers: cancel stops them, done reports their Run errors.
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
}

func (b *benchWorkers) err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.news {
		select {
		case <-w.Stopping():
			return fmt.Errorf("worker %s stopped: %v", w.ID(), w.Err())
		default:
		}
	}
	return errors.Join(b.errs...)
}

func (b *benchWorkers) stop() error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, w := range b.news {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := w.Stop(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if b.cancel != nil {
		b.cancel()
	}
	b.wg.Wait()
	for _, p := range b.pools {
		p.Close()
	}
	b.mu.Lock()
	errs = append(errs, b.errs...)
	b.mu.Unlock()
	for _, w := range b.news {
		if st := w.Stats(); st.WriteErrors > 0 || st.ClaimErrors > 0 || st.Failed > 0 {
			errs = append(errs, fmt.Errorf("worker %s: %+v", w.ID(), st))
		}
	}
	return errors.Join(errs...)
}

// claimStats: start_tasks calls and tasks per call (new worker only).
func (b *benchWorkers) claimStats() (int64, float64) {
	var calls, claimed int64
	for _, w := range b.news {
		st := w.Stats()
		calls += st.ClaimCalls
		claimed += st.Claimed
	}
	if calls == 0 {
		return 0, 0
	}
	return calls, float64(claimed) / float64(calls)
}

// completed is the new workers' completion count, -1 for old workers (they
// keep none; the database check covers them).
func (b *benchWorkers) completed() int64 {
	if len(b.news) == 0 {
		return -1
	}
	var n int64
	for _, w := range b.news {
		n += w.Stats().Completed
	}
	return n
}

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

var noOutput = json.RawMessage("true") // the same output on both paths (0.16.0 sends falsy outputs as null)

func startBenchWorkers(ctx context.Context, p protocol, shape workerShape, dsn string, n int) (*benchWorkers, error) {
	b := &benchWorkers{}
	// The workers are the application: its sessions, on purpose not pinned.
	opts := session.Options{Purpose: session.Application, MaxConns: wbPoolConns}
	if wbTrackFunctions() {
		opts.Settings = map[string]string{"track_functions": "all"}
	}
	for range n {
		pool, err := session.OpenPool(ctx, dsn, opts)
		if err != nil {
			_ = b.stop()
			return nil, err
		}
		b.pools = append(b.pools, pool)
	}
	if p == protoNew {
		for _, pool := range b.pools {
			w, err := worker.New(pool, worker.Config{
				Flow:              shape.newFlow(),
				Handlers:          map[string]worker.HandlerFunc{"work": func(context.Context, *worker.Task) (any, error) { return noOutput, nil }},
				BatchSize:         wbBatchSize,
				Concurrency:       wbConcurrency,
				VisibilityTimeout: wbVisibility * time.Second,
				PollInterval:      wbPollInterval,
				MaxPollSeconds:    wbPollSeconds,
				ClaimLinger:       wbClaimLinger(),
				Logger:            discardLogger,
			})
			if err == nil {
				err = w.Start(context.WithoutCancel(ctx))
			}
			if err != nil {
				_ = b.stop()
				return nil, err
			}
			b.news = append(b.news, w)
		}
		return b, nil
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b.cancel = cancel
	for _, pool := range b.pools {
		w := oldworker.New(pool, oldworker.Config{
			FlowSlug:          wbFlowSlug,
			Shape:             shape.oldFlow().MustShape(),
			Handlers:          map[string]oldworker.Handler{"work": func(context.Context, oldworker.Task) (any, error) { return noOutput, nil }},
			BatchSize:         wbBatchSize,
			MaxConcurrent:     wbConcurrency,
			VisibilityTimeout: wbVisibility,
			MaxPollSeconds:    wbPollSeconds,
			PollIntervalMs:    int(wbPollInterval / time.Millisecond),
			Logger:            discardLogger,
		})
		if err := w.Start(ctx); err != nil {
			_ = b.stop()
			return nil, err
		}
		b.wg.Go(func() {
			if err := w.Run(runCtx); err != nil {
				b.mu.Lock()
				b.errs = append(b.errs, err)
				b.mu.Unlock()
			}
		})
	}
	return b, nil
}
