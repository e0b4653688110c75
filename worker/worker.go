package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Stats are the worker's counters since Start.
type Stats struct {
	ClaimCalls  int64 // claim_tasks calls that returned
	Claimed     int64 // tasks handed to this worker
	Completed   int64
	Failed      int64 // fail_task calls (retries included)
	Panicked    int64 // handler panics (also counted in Failed)
	Released    int64
	Abandoned   int64
	Fatal       int64 // fatal claim results (messages refused by claim_tasks)
	WriteErrors int64
}

type counters struct {
	claimCalls, claimed, completed, failed, panicked, released, abandoned, fatal, writeErrors atomic.Int64
}

// Worker runs the tasks of one flow on the new (queue-aware) protocol. Create
// it with New, run it with Start and Stop (or Run).
type Worker struct {
	pool  *pgxpool.Pool
	cfg   Config
	log   *slog.Logger
	queue string // resolved at Start

	started atomic.Bool // Start was called
	startMu sync.Mutex  // held while Start runs
	running bool        // Start succeeded (guarded by startMu)

	// hardCtx is Start's context: cancelling it stops everything at once,
	// as if the process died (only results already produced are written).
	hardCtx context.Context
	// fetchCtx stops the claim loop (soft stop: nothing in flight is
	// touched).
	fetchCtx    context.Context
	fetchCancel context.CancelFunc
	// workCtx is the parent of every handler's context; cancelled at the end
	// of the soft phase.
	workCtx    context.Context
	workCancel context.CancelFunc
	// hbCtx stops the heartbeat, last.
	hbCtx    context.Context
	hbCancel context.CancelFunc

	slots    chan struct{} // a token per running handler
	inflight sync.WaitGroup
	loops    sync.WaitGroup // claim loop
	hbDone   chan struct{}

	shutdownOnce sync.Once
	stopping     chan struct{} // closed when the soft stop begins
	forceOnce    sync.Once
	force        chan struct{} // closed to end the soft phase early
	done         chan struct{} // closed when the worker is fully stopped
	errMu        sync.Mutex
	err          error // why the worker stopped on its own, if it did

	n counters
	// writeNanos is a moving average of complete_task round trips: how slow
	// the database is to take outcomes (see lingerFor).
	writeNanos atomic.Int64
}

// New validates cfg (after filling in defaults) and returns a worker that has
// not touched the database yet.
func New(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	if pool == nil {
		return nil, &ConfigError{Field: "pool", Reason: "is nil"}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Worker{
		pool:     pool,
		cfg:      cfg,
		log:      cfg.Logger.With(slog.String("flow_slug", cfg.Flow.Slug), slog.String("worker_id", cfg.WorkerID)),
		slots:    make(chan struct{}, cfg.Concurrency),
		hbDone:   make(chan struct{}),
		stopping: make(chan struct{}),
		force:    make(chan struct{}),
		done:     make(chan struct{}),
	}, nil
}

// ID returns the worker's uuid.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// Queue returns the queue the worker claims from (known after Start).
func (w *Worker) Queue() string { return w.queue }

// Stopping is closed when the worker stops claiming (Stop was called, it was
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
		ClaimCalls: w.n.claimCalls.Load(), Claimed: w.n.claimed.Load(), Completed: w.n.completed.Load(),
		Failed: w.n.failed.Load(), Panicked: w.n.panicked.Load(), Released: w.n.released.Load(),
		Abandoned: w.n.abandoned.Load(), Fatal: w.n.fatal.Load(), WriteErrors: w.n.writeErrors.Load(),
	}
}

// Start runs the startup sequence and then claims in the background:
//
//  1. the fence (CheckProtocol): a *ProtocolMismatchError before anything is
//     written;
//  2. ensure_flow_compiled(slug, shape, false): a *FlowMismatchError if the
//     database has a different shape;
//  3. registration in pgflow.workers;
//  4. the heartbeat and the claim loop.
//
// ctx is the worker's lifetime: cancelling it is a hard stop (handlers are
// cancelled, nothing is released, the worker is not marked stopped, its
// tasks come back after their visibility timeout). Use Stop to stop
// gracefully.
func (w *Worker) Start(ctx context.Context) error { return w.start(ctx, ctx) }

// start runs the startup calls on ctx and the worker's lifetime on life.
func (w *Worker) start(ctx, life context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrStopped
	}
	w.startMu.Lock()
	defer w.startMu.Unlock()
	if err := CheckProtocol(ctx, w.pool); err != nil {
		return w.failStart(err)
	}
	res, err := EnsureFlow(ctx, w.pool, w.cfg.Flow)
	if err != nil {
		return w.failStart(err)
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, "flow ensured", slog.String("status", res.Status))

	var queue string
	if err := w.pool.QueryRow(ctx, `select f.queue_name from pgflow.flows f where f.flow_slug = $1`, w.cfg.Flow.Slug).Scan(&queue); err != nil {
		return w.failStart(fmt.Errorf("reading the queue of flow %q: %w", w.cfg.Flow.Slug, err))
	}
	if w.cfg.Queue != "" && w.cfg.Queue != queue {
		return w.failStart(&ConfigError{Field: "Queue", Reason: fmt.Sprintf("flow %q uses queue %q, not %q", w.cfg.Flow.Slug, queue, w.cfg.Queue)})
	}
	w.queue = queue
	w.log = w.log.With(slog.String("queue_name", queue))

	if _, err := w.pool.Exec(ctx,
		`insert into pgflow.workers (worker_id, queue_name, function_name) values ($1::uuid, $2, $3)`,
		w.cfg.WorkerID, queue, w.cfg.FunctionName); err != nil {
		return w.failStart(fmt.Errorf("registering worker %s in pgflow.workers: %w", w.cfg.WorkerID, err))
	}

	w.hardCtx = life
	w.fetchCtx, w.fetchCancel = context.WithCancel(life)
	w.workCtx, w.workCancel = context.WithCancel(life)
	w.hbCtx, w.hbCancel = context.WithCancel(life)

	w.running = true
	w.loops.Add(1)
	go w.claimLoop()
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
		slog.Int("concurrency", w.cfg.Concurrency), slog.Int("batch_size", w.cfg.BatchSize),
		slog.Duration("visibility_timeout", w.cfg.VisibilityTimeout))
	return nil
}

func (w *Worker) failStart(err error) error {
	close(w.stopping)
	close(w.done)
	return fmt.Errorf("starting worker for flow %q: %w", w.cfg.Flow.Slug, err)
}

// Stop stops gracefully: it stops claiming, lets in-flight handlers finish
// within ShutdownTimeout, then cancels the rest and releases their tasks so
// they are visible again at once, and marks the worker stopped. If ctx ends
// first, the soft phase ends at once; Stop then returns ctx.Err() without
// waiting for handlers that ignore their context (their results are still
// written when they return). Do not call Stop from a handler or a callback:
// it waits for them.
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
		// Stop applies ShutdownTimeout itself; the extra margin only bounds
		// how long we wait for handlers that ignore cancellation.
		stopCtx, cancel := context.WithTimeout(context.Background(), w.cfg.ShutdownTimeout+w.cfg.WriteTimeout+time.Duration(w.cfg.MaxPollSeconds)*time.Second)
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
		w.fetchCancel()
		go w.shutdown()
	})
}

func (w *Worker) shutdown() {
	defer close(w.done)
	killed := func() bool { return w.hardCtx.Err() != nil }

	// No new handlers start once the claim loop has returned.
	w.loops.Wait()

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
	// Handlers that return because of this have their tasks released (or,
	// when killed, abandoned) by their own goroutine.
	w.workCancel()
	<-drained

	w.hbCancel()
	<-w.hbDone

	if killed() {
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "worker killed: not marked stopped; its unfinished tasks return after their visibility timeout")
		return
	}
	ctx, cancel := w.writeCtx()
	defer cancel()
	if _, err := w.pool.Exec(ctx, `select pgflow.mark_worker_stopped($1::uuid)`, w.cfg.WorkerID); err != nil {
		w.n.writeErrors.Add(1)
		w.log.LogAttrs(ctx, slog.LevelError, "marking worker stopped", slog.Any("error", err))
		w.setErr(fmt.Errorf("marking worker %s stopped: %w", w.cfg.WorkerID, err))
		return
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, "worker stopped", slog.Any("stats", w.Stats()))
}

func (w *Worker) setErr(err error) {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// writeCtx is the context of every write of a task's outcome: never
// cancelled by a stop or a kill (claimed work is not stranded by a cancel),
// only bounded by WriteTimeout.
func (w *Worker) writeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(w.hardCtx), w.cfg.WriteTimeout)
}

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
			`update pgflow.workers set last_heartbeat_at = now() where worker_id = $1::uuid returning deprecated_at is not null`,
			w.cfg.WorkerID).Scan(&deprecated)
		switch {
		case w.hbCtx.Err() != nil:
			return
		case errors.Is(err, pgx.ErrNoRows):
			// The row is gone (pruned as stale, or deleted by hand). Claims
			// record last_worker_id, a foreign key to it, so put it back.
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "worker row missing at heartbeat: registering again")
			if _, err := w.pool.Exec(w.hbCtx,
				`insert into pgflow.workers (worker_id, queue_name, function_name) values ($1::uuid, $2, $3) on conflict (worker_id) do nothing`,
				w.cfg.WorkerID, w.queue, w.cfg.FunctionName); err != nil && w.hbCtx.Err() == nil {
				w.log.LogAttrs(w.hbCtx, slog.LevelError, "registering again failed", slog.Any("error", err))
			}
		case err != nil:
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "heartbeat failed", slog.Any("error", err))
		case deprecated:
			w.log.LogAttrs(w.hbCtx, slog.LevelWarn, "worker deprecated: stopping claims and shutting down")
			w.beginShutdown()
		}
	}
}

// claimLoop claims as many tasks as there are free slots (at most BatchSize)
// and runs each in its own goroutine.
func (w *Worker) claimLoop() {
	defer w.loops.Done()
	backoff := time.Duration(0)
	for {
		// Wait for one free slot, then take every other free one.
		select {
		case w.slots <- struct{}{}:
		case <-w.fetchCtx.Done():
			return
		}
		n := 1
	more:
		for n < w.cfg.BatchSize {
			select {
			case w.slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		if !w.linger(&n) {
			w.freeSlots(n)
			return
		}

		// The claim runs on hardCtx, not fetchCtx: a soft stop never cuts a
		// claim off after the database has handed tasks over.
		claimed, fatal, err := Claim(w.hardCtx, w.pool, ClaimParams{
			Queue: w.queue, WorkerID: w.cfg.WorkerID, BatchSize: n,
			VisibilityTimeout: w.cfg.VisibilityTimeout,
			MaxPollSeconds:    max(w.cfg.MaxPollSeconds, 0),
			PollInterval:      w.cfg.PollInterval,
		})
		if err != nil {
			w.freeSlots(n)
			if w.hardCtx.Err() != nil {
				return
			}
			if errors.Is(err, ErrProtocolMismatch) {
				// The schema changed under us: claiming cannot work again.
				w.log.LogAttrs(w.hardCtx, slog.LevelError, "claim failed: protocol mismatch; shutting down", slog.Any("error", err))
				w.setErr(err)
				go w.beginShutdown()
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			w.log.LogAttrs(w.hardCtx, slog.LevelError, "claim failed", slog.Any("error", err), slog.Duration("retry_in", backoff))
			if !w.sleep(backoff) {
				return
			}
			continue
		}
		backoff = 0
		w.n.claimCalls.Add(1)
		for _, f := range fatal {
			w.n.fatal.Add(1)
			w.log.LogAttrs(w.hardCtx, slog.LevelError, "fatal claim result: message refused, left invisible for the visibility timeout",
				slog.String("queue_name", f.QueueName), slog.Int64("message_id", f.MessageID), slog.String("reason", f.Reason))
			if w.cfg.OnFatal != nil {
				w.cfg.OnFatal(f)
			}
		}
		w.n.claimed.Add(int64(len(claimed)))
		w.freeSlots(n - len(claimed))
		if w.fetchCtx.Err() != nil {
			// Stopping: these never started, so give them straight back.
			for _, t := range claimed {
				w.release(t, nil)
				w.freeSlots(1)
			}
			return
		}
		for _, t := range claimed {
			w.inflight.Add(1)
			go w.runTask(t)
		}
		if len(claimed) == 0 && len(fatal) == 0 && w.cfg.MaxPollSeconds <= 0 {
			if !w.sleep(w.cfg.PollInterval) {
				return
			}
		}
	}
}

// observeWrite folds one complete_task round trip into writeNanos (an
// exponential moving average, weight 1/8; a lost update under concurrency
// only makes it a little less smooth).
func (w *Worker) observeWrite(d time.Duration) {
	old := w.writeNanos.Load()
	w.writeNanos.Store(old + (int64(d)-old)/8)
}

// lingerFor is how long the claim loop may wait for more free slots:
// ClaimLinger, plus the recent complete_task round trip (at most 10x
// ClaimLinger more). When completions queue in the database (many workers on
// one busy run, an overloaded server), slots free slowly and claiming each
// one at once only adds claim_tasks calls to the load that slows them; a
// fast database keeps the wait at ClaimLinger.
func (w *Worker) lingerFor() time.Duration {
	return w.cfg.ClaimLinger + min(time.Duration(w.writeNanos.Load()), 10*w.cfg.ClaimLinger)
}

// linger waits up to lingerFor for more slots while handlers still run, so
// one claim serves several tasks; n counts the slots taken. It returns false
// when the claim loop is stopped meanwhile.
func (w *Worker) linger(n *int) bool {
	want := min(w.cfg.BatchSize, w.cfg.Concurrency)
	if w.cfg.ClaimLinger <= 0 || *n >= want || len(w.slots) == *n {
		return true // nothing to gain, or no handler running that could free a slot
	}
	t := time.NewTimer(w.lingerFor())
	defer t.Stop()
	for *n < want {
		select {
		case w.slots <- struct{}{}:
			*n++
		case <-t.C:
			return true
		case <-w.fetchCtx.Done():
			return false
		}
	}
	return true
}

func (w *Worker) freeSlots(n int) {
	for range n {
		<-w.slots
	}
}

// sleep waits d unless the claim loop is stopped first.
func (w *Worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.fetchCtx.Done():
		return false
	}
}

func taskAttrs(t ClaimedTask) slog.Attr {
	return slog.Group("task",
		slog.String("queue_name", t.QueueName), slog.Int64("message_id", t.MessageID),
		slog.String("run_id", t.RunID), slog.String("step_slug", t.StepSlug),
		slog.Int("task_index", t.TaskIndex), slog.Int("attempt", t.Attempt))
}

func (w *Worker) runTask(t ClaimedTask) {
	defer w.inflight.Done()
	defer w.freeSlots(1)

	ctx, cancel := context.WithCancel(w.workCtx)
	out, err, panicked := w.callHandler(ctx, t)
	cancel()

	switch {
	case err == nil:
		w.complete(t, out)
	case w.workCtx.Err() != nil && !panicked:
		// The handler gave up because we cancelled it: not a failure.
		if w.hardCtx.Err() != nil {
			w.n.abandoned.Add(1)
			w.log.LogAttrs(context.Background(), slog.LevelWarn, "task abandoned by a hard stop", taskAttrs(t))
			w.report(Result{Task: t, Outcome: OutcomeAbandoned, Err: err})
			return
		}
		w.release(t, err)
	default:
		w.fail(t, err, panicked)
	}
}

func (w *Worker) callHandler(ctx context.Context, t ClaimedTask) (out any, err error, panicked bool) {
	h := w.cfg.Handlers[t.StepSlug]
	if h == nil {
		// Validation makes this impossible for the configured flow; a task of
		// an unknown step still must not vanish.
		return nil, fmt.Errorf("no handler for step %q", t.StepSlug), false
	}
	defer func() {
		if r := recover(); r != nil {
			w.n.panicked.Add(1)
			w.log.LogAttrs(ctx, slog.LevelError, "handler panicked", taskAttrs(t),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			out, err, panicked = nil, fmt.Errorf("panic: %v", r), true
		}
	}()
	out, err = h(ctx, &Task{ClaimedTask: t, WorkerID: w.cfg.WorkerID})
	return out, err, false
}

func (w *Worker) report(r Result) {
	if w.cfg.OnResult != nil {
		w.cfg.OnResult(r)
	}
}

func marshalOutput(out any) (string, error) {
	switch v := out.(type) {
	case nil:
		return "null", nil
	case json.RawMessage:
		if !json.Valid(v) {
			return "", errors.New("output is not valid JSON")
		}
		return string(v), nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("encoding output: %w", err)
	}
	return string(b), nil
}

func (w *Worker) complete(t ClaimedTask, out any) {
	output, err := marshalOutput(out)
	if err != nil {
		// Output the engine cannot store is the handler's failure.
		w.fail(t, err, false)
		return
	}
	ctx, cancel := w.writeCtx()
	defer cancel()
	var status string
	began := time.Now()
	err = w.pool.QueryRow(ctx,
		`select coalesce((select c.status from pgflow.complete_task($1::uuid, $2::text, $3::integer, $4::jsonb) c), 'missing')`,
		t.RunID, t.StepSlug, t.TaskIndex, output).Scan(&status)
	w.observeWrite(time.Since(began))
	if err != nil {
		w.writeFailed(t, fmt.Errorf("completing task %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err))
		return
	}
	w.n.completed.Add(1)
	if status != "completed" {
		// A late completion (the run failed, the step was skipped, the task
		// was taken back): the engine archived the message and kept its state.
		w.log.LogAttrs(ctx, slog.LevelInfo, "completion not applied", taskAttrs(t), slog.String("task_status", status))
	}
	w.report(Result{Task: t, Outcome: OutcomeCompleted})
}

func (w *Worker) fail(t ClaimedTask, herr error, panicked bool) {
	msg := herr.Error()
	ctx, cancel := w.writeCtx()
	defer cancel()
	var status string
	err := w.pool.QueryRow(ctx,
		`select coalesce((select f.status from pgflow.fail_task($1::uuid, $2::text, $3::integer, $4::text) f), 'missing')`,
		t.RunID, t.StepSlug, t.TaskIndex, msg).Scan(&status)
	if err != nil {
		w.writeFailed(t, fmt.Errorf("failing task %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err))
		return
	}
	w.n.failed.Add(1)
	w.log.LogAttrs(ctx, slog.LevelWarn, "task failed", taskAttrs(t),
		slog.String("error", msg), slog.Bool("panicked", panicked), slog.String("task_status", status))
	w.report(Result{Task: t, Outcome: OutcomeFailed, Panicked: panicked, Err: herr})
}

// release gives a started task back (queued again, message visible now,
// attempt not consumed).
func (w *Worker) release(t ClaimedTask, cause error) {
	ctx, cancel := w.writeCtx()
	defer cancel()
	var ok bool
	err := w.pool.QueryRow(ctx, `select pgflow.release_task($1::uuid, $2::text, $3::integer, $4::uuid)`,
		t.RunID, t.StepSlug, t.TaskIndex, w.cfg.WorkerID).Scan(&ok)
	if err != nil {
		w.writeFailed(t, fmt.Errorf("releasing task %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err))
		return
	}
	w.n.released.Add(1)
	w.log.LogAttrs(ctx, slog.LevelInfo, "task released", taskAttrs(t), slog.Bool("was_ours", ok))
	w.report(Result{Task: t, Outcome: OutcomeReleased, Err: cause})
}

// writeFailed: the outcome could not be written. The task stays started with
// its message invisible until the visibility timeout, then another worker
// claims it: delayed, not lost.
func (w *Worker) writeFailed(t ClaimedTask, err error) {
	w.n.writeErrors.Add(1)
	w.n.abandoned.Add(1)
	w.log.LogAttrs(context.Background(), slog.LevelError, "writing task outcome failed; the task returns after its visibility timeout",
		taskAttrs(t), slog.Any("error", err))
	w.report(Result{Task: t, Outcome: OutcomeAbandoned, Err: err})
}
