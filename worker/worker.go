package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stats are the worker's counters since Start.
type Stats struct {
	Polls       int64 // read_with_poll calls that returned
	Read        int64 // messages those polls returned
	ClaimCalls  int64 // start_tasks calls that returned
	Claimed     int64 // tasks start_tasks handed to this worker
	Unclaimed   int64 // messages read that start_tasks did not claim (back after their vt)
	ClaimErrors int64 // start_tasks calls that failed (messages back after their vt)
	Completed   int64
	Failed      int64 // fail_task calls (retries included)
	Panicked    int64 // handler panics (also counted in Failed)
	Abandoned   int64 // tasks left started: cancelled by a stop, or their outcome write failed
	WriteErrors int64
}

type counters struct {
	polls, read, claimCalls, claimed, unclaimed, claimErrors,
	completed, failed, panicked, abandoned, writeErrors atomic.Int64
}

// Worker runs the tasks of one flow (flow mode) or of one step of a
// step-mode flow, as a pgflow 0.17 worker. Create it with New, run it with
// Start and Stop (or Run).
type Worker struct {
	pool   *pgxpool.Pool
	cfg    Config
	log    *slog.Logger
	routes []Route // resolved by New, with no database call
	queue  string  // the canonical route this worker polls

	started atomic.Bool // Start was called
	startMu sync.Mutex  // held while Start runs
	running bool        // Start succeeded (guarded by startMu)

	// hardCtx is the worker's lifetime (Start's context): cancelling it
	// stops everything at once, as if the process died.
	hardCtx context.Context
	// fetchCtx stops polling (the soft stop): a poll in flight is cancelled,
	// a claim in flight is not.
	fetchCtx    context.Context
	fetchCancel context.CancelFunc
	// workCtx is the parent of every handler's context; cancelled at the end
	// of the soft phase.
	workCtx    context.Context
	workCancel context.CancelFunc
	// hbCtx stops the heartbeat, at the start of a stop.
	hbCtx    context.Context
	hbCancel context.CancelFunc

	slots    chan struct{} // a token per running handler
	inflight sync.WaitGroup
	loops    sync.WaitGroup // poll loop
	hbDone   chan struct{}

	shutdownOnce sync.Once
	stopping     chan struct{} // closed when the stop begins
	forceOnce    sync.Once
	force        chan struct{} // closed to end the soft phase early
	done         chan struct{} // closed when the worker is fully stopped
	errMu        sync.Mutex
	err          error // why the worker stopped on its own, if it did

	n counters
	// writeNanos is a moving average of outcome write round trips: how slow
	// the database is to take outcomes (see writeWait).
	writeNanos atomic.Int64
	// pastHandler counts tasks whose handler has returned and whose slot is
	// not free yet: their outcome write is in flight (see writeWait).
	pastHandler atomic.Int64
}

// New validates cfg (after filling in defaults), resolves the flow's routes
// locally and returns a worker that has not touched the database yet.
func New(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	if pool == nil {
		return nil, &ConfigError{Field: "pool", Reason: "is nil"}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	routes, err := cfg.Flow.Routes()
	if err != nil {
		return nil, err
	}
	queue := routes[0].QueueName // flow mode: the same for every step
	if cfg.Flow.mode() == QueueModeStep {
		queue, _ = routeOf(routes, cfg.StepSlug) // validate checked the step exists
	}
	attrs := []any{slog.String("flow_slug", cfg.Flow.Slug), slog.String("worker_id", cfg.WorkerID), slog.String("queue_name", queue)}
	if cfg.StepSlug != "" {
		attrs = append(attrs, slog.String("step_slug", cfg.StepSlug))
	}
	return &Worker{
		pool:     pool,
		cfg:      cfg,
		log:      cfg.Logger.With(attrs...),
		routes:   routes,
		queue:    queue,
		slots:    make(chan struct{}, cfg.Concurrency),
		hbDone:   make(chan struct{}),
		stopping: make(chan struct{}),
		force:    make(chan struct{}),
		done:     make(chan struct{}),
	}, nil
}

// ID returns the worker's uuid.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Queue returns the canonical route the worker polls: lower(flow slug) in
// flow mode, its step's queue in step mode. Known from New on.
func (w *Worker) Queue() string { return w.queue }

// Routes returns the flow's route map as sent to ensure_flow_compiled.
func (w *Worker) Routes() []Route { return append([]Route(nil), w.routes...) }

// Stopping is closed when the worker stops polling (Stop was called, it was
// deprecated, or Start's context was cancelled).
func (w *Worker) Stopping() <-chan struct{} { return w.stopping }

// Done is closed when the worker has fully stopped.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Err returns why the worker stopped on its own (nil after Stop, and nil
// while running).
func (w *Worker) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// Stats returns a snapshot of the counters.
func (w *Worker) Stats() Stats {
	return Stats{
		Polls: w.n.polls.Load(), Read: w.n.read.Load(), ClaimCalls: w.n.claimCalls.Load(),
		Claimed: w.n.claimed.Load(), Unclaimed: w.n.unclaimed.Load(), ClaimErrors: w.n.claimErrors.Load(),
		Completed: w.n.completed.Load(), Failed: w.n.failed.Load(), Panicked: w.n.panicked.Load(),
		Abandoned: w.n.abandoned.Load(), WriteErrors: w.n.writeErrors.Load(),
	}
}

// Start runs upstream's startup sequence and then polls in the background:
//
//  1. pgflow.ensure_flow_compiled(slug, shape, queue_mode, route_map): a
//     *ProtocolMismatchError on a 0.16.0 database, a *FlowShapeMismatchError
//     or *FlowRoutingMismatchError on a mismatch; nothing is registered yet;
//  2. pgflow.track_worker_function(name[, 'process']);
//  3. registration in pgflow.workers with the canonical route (and, on
//     0.17.1 and later, Config.PgflowVersion as pgflow_version);
//  4. the heartbeat and the poll loop.
//
// ctx is the worker's lifetime: cancelling it is a hard stop (handlers are
// cancelled, the worker is not marked stopped, its unfinished tasks are
// taken back by requeue_stalled_tasks after their visibility timeout). Use
// Stop to stop gracefully.
func (w *Worker) Start(ctx context.Context) error { return w.start(ctx, ctx) }

// start runs the startup calls on ctx and the worker's lifetime on life.
func (w *Worker) start(ctx, life context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrStopped
	}
	w.startMu.Lock()
	defer w.startMu.Unlock()
	res, err := EnsureFlow(ctx, w.pool, w.cfg.Flow)
	if err != nil {
		return w.failStart(err)
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, "flow ensured", slog.String("status", res.Status))

	if w.cfg.StartMode == StartModeHTTP {
		_, err = w.pool.Exec(ctx, `select pgflow.track_worker_function($1::text)`, w.cfg.FunctionName)
	} else {
		_, err = w.pool.Exec(ctx, `select pgflow.track_worker_function($1::text, $2::text)`, w.cfg.FunctionName, w.cfg.StartMode)
	}
	if err != nil {
		return w.failStart(fmt.Errorf("tracking worker function %q: %w", w.cfg.FunctionName, err))
	}
	// 0.17.1 records the worker's version; 0.17.0 has no such column.
	var withVersion bool
	if err := w.pool.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_attribute
		 where attrelid = pg_catalog.to_regclass('pgflow.workers') and attname = 'pgflow_version' and not attisdropped)`).Scan(&withVersion); err != nil {
		return w.failStart(fmt.Errorf("looking for pgflow.workers.pgflow_version: %w", err))
	}
	register := `insert into pgflow.workers (queue_name, worker_id, function_name) values ($1, $2::uuid, $3) returning started_at`
	args := []any{w.queue, w.cfg.WorkerID, w.cfg.FunctionName}
	if withVersion {
		register = `insert into pgflow.workers (queue_name, worker_id, function_name, pgflow_version) values ($1, $2::uuid, $3, $4) returning started_at`
		args = append(args, w.cfg.PgflowVersion)
	}
	var startedAt time.Time
	if err := w.pool.QueryRow(ctx, register, args...).Scan(&startedAt); err != nil {
		return w.failStart(fmt.Errorf("registering worker %s in pgflow.workers: %w", w.cfg.WorkerID, err))
	}

	w.hardCtx = life
	w.fetchCtx, w.fetchCancel = context.WithCancel(life)
	w.workCtx, w.workCancel = context.WithCancel(life)
	w.hbCtx, w.hbCancel = context.WithCancel(life)

	w.running = true
	w.loops.Add(1)
	go w.pollLoop()
	go w.heartbeatLoop()
	// A cancelled Start context (hard stop) runs the same shutdown, which
	// then skips everything that would write.
	go func() {
		select {
		case <-life.Done():
			w.beginShutdown()
		case <-w.stopping:
		}
	}()
	w.log.LogAttrs(ctx, slog.LevelInfo, "worker started",
		slog.Time("started_at", startedAt), slog.String("queue_mode", string(w.cfg.Flow.mode())),
		slog.Int("concurrency", w.cfg.Concurrency), slog.Int("batch_size", w.cfg.BatchSize),
		slog.Duration("visibility_timeout", w.cfg.VisibilityTimeout))
	return nil
}

func (w *Worker) failStart(err error) error {
	close(w.stopping)
	close(w.done)
	return fmt.Errorf("starting worker for flow %q: %w", w.cfg.Flow.Slug, err)
}

// Stop stops gracefully, in upstream's order: mark_worker_stopped, stop
// polling, let in-flight handlers finish (within ShutdownTimeout, then their
// contexts are cancelled) and write their outcomes. If ctx ends first, the
// soft phase ends at once; Stop then returns ctx.Err() without waiting for
// handlers that ignore their context (their results are still written when
// they return). Do not call Stop from a handler or a callback: it waits for
// them.
func (w *Worker) Stop(ctx context.Context) error {
	w.startMu.Lock()
	running := w.running
	w.startMu.Unlock()
	if !running {
		return nil // never started, or Start failed (nothing to undo)
	}
	w.beginShutdown()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
	}
	w.forceOnce.Do(func() { close(w.force) })
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping worker %s: %w", w.cfg.WorkerID, ctx.Err())
	}
}

// Run starts the worker and stops it gracefully when ctx is cancelled (for
// instance by signal.NotifyContext), or returns when the worker stopped on
// its own (deprecated). It returns the startup error, or Err().
func (w *Worker) Run(ctx context.Context) error {
	// Startup can be interrupted; once running, ctx only triggers Stop.
	if err := w.start(ctx, context.WithoutCancel(ctx)); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		// Stop applies ShutdownTimeout itself; the margin only bounds how
		// long we wait for handlers that ignore cancellation.
		stopCtx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout+2*w.cfg.WriteTimeout)
		defer cancel()
		if err := w.Stop(stopCtx); err != nil {
			return err
		}
	case <-w.done:
	}
	return w.Err()
}

func (w *Worker) beginShutdown() {
	w.shutdownOnce.Do(func() {
		close(w.stopping)
		go w.shutdown()
	})
}

func (w *Worker) shutdown() {
	defer close(w.done)
	killed := func() bool { return w.hardCtx.Err() != nil }

	// 1. Upstream marks the worker stopped first, then stops polling.
	if !killed() {
		ctx, cancel := w.writeCtx()
		if _, err := w.pool.Exec(ctx, `select pgflow.mark_worker_stopped($1::uuid)`, w.cfg.WorkerID); err != nil {
			w.n.writeErrors.Add(1)
			w.log.LogAttrs(ctx, slog.LevelError, "marking worker stopped", slog.Any("error", err))
			w.setErr(fmt.Errorf("marking worker %s stopped: %w", w.cfg.WorkerID, err))
		}
		cancel()
	}
	// 2. Stop polling and heartbeating; no new handler starts once the poll
	// loop has returned (a claim in flight finishes and its tasks run).
	w.fetchCancel()
	w.hbCancel()
	w.loops.Wait()
	<-w.hbDone

	// 3. Wait for in-flight tasks; their outcomes are written on writeCtx.
	drained := make(chan struct{})
	go func() { w.inflight.Wait(); close(drained) }()
	soft := time.NewTimer(w.cfg.ShutdownTimeout)
	defer soft.Stop()
	select {
	case <-drained:
	case <-soft.C:
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "shutdown timeout: cancelling in-flight handlers",
			slog.Duration("shutdown_timeout", w.cfg.ShutdownTimeout))
	case <-w.force:
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "stop context ended: cancelling in-flight handlers")
	case <-w.hardCtx.Done():
	}
	w.workCancel()
	<-drained

	if killed() {
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "worker killed: not marked stopped; its unfinished tasks are taken back by requeue_stalled_tasks after their visibility timeout")
		return
	}
	w.log.LogAttrs(context.Background(), slog.LevelInfo, "worker stopped", slog.Any("stats", w.Stats()))
}

func (w *Worker) setErr(err error) {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// writeCtx is the context of every outcome write: never cancelled by a stop
// or a kill (claimed work is not stranded by a cancel), only bounded by
// WriteTimeout.
func (w *Worker) writeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(w.hardCtx), w.cfg.WriteTimeout)
}

// heartbeatLoop: every HeartbeatInterval, last_heartbeat_at =
// clock_timestamp(), returning whether deprecated_at is set. A deprecated
// worker (or one whose row is gone, as upstream counts it) stops polling and
// shuts down gracefully.
func (w *Worker) heartbeatLoop() {
	defer close(w.hbDone)
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-w.hbCtx.Done():
			return
		case <-t.C:
		}
		var deprecated bool
		err := w.pool.QueryRow(w.hbCtx,
			`update pgflow.workers set last_heartbeat_at = pg_catalog.clock_timestamp() where worker_id = $1::uuid
			 returning deprecated_at is not null`,
			w.cfg.WorkerID).Scan(&deprecated)
		switch {
		case w.hbCtx.Err() != nil:
			return
		case errors.Is(err, pgx.ErrNoRows):
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "worker row missing at heartbeat: counted as deprecated; stopping")
			w.beginShutdown()
			return
		case err != nil:
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "heartbeat failed", slog.Any("error", err))
		case deprecated:
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "worker deprecated: stopping polling and shutting down")
			w.beginShutdown()
			return
		}
	}
}
