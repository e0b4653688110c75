package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// DrainOptions configure Drain.
type DrainOptions struct {
	// FastForward makes every message of the flows' queues visible before
	// each round (pgmq.set_vt(.., 0)): the leases of tasks started before the
	// upgrade, retry delays and start delays "pass" at once, so a drain does
	// not wait for minutes of visibility timeouts. Without it the drain waits
	// for messages to become visible on their own.
	FastForward bool
	// Timeout bounds the drain (default 60 s).
	Timeout time.Duration
}

// DrainReport says what a drain did.
type DrainReport struct {
	Claimed   int
	Completed int
	// Stuck are runs that cannot finish by design: a permanently stalled
	// task (0.16.0 keeps it started, its message archived) needs an operator.
	Stuck []string
}

type drainFlow struct {
	def   worker.Flow
	queue string
	// feedsMap: steps a map step depends on; their output is an array.
	feedsMap map[string]bool
}

// Drain runs every in-flight run of the upgraded database to completion with
// the new worker runtime (package worker): one worker per flow, the flow
// definition read back from pgflow.steps and pgflow.deps (so ensure_flow_compiled
// verifies it), handlers that succeed, a step feeding a map with a
// two-element array. Every flow is taken in flow mode (its queue
// lower(flow_slug)), the mode of every flow the upgrade migrates. It fails
// when a worker refuses to start, when a run that can finish does not, or
// when a message of a finished run is left in a queue.
func Drain(ctx context.Context, db *DB, opts DrainOptions) (*DrainReport, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	flows, err := loadFlows(ctx, db)
	if err != nil {
		return nil, err
	}
	if opts.FastForward {
		// Leases of tasks started before the upgrade, retry and start delays.
		if err := fastForward(ctx, db, flows, false); err != nil {
			return nil, err
		}
	}
	d := &drainer{db: db, opts: opts, flows: flows}
	// On any early return the workers still running are stopped.
	defer d.stopAll()
	if err := d.startWorkers(ctx); err != nil {
		return nil, err
	}
	rep := &DrainReport{}
	if err := d.waitForRuns(ctx, rep); err != nil {
		return rep, err
	}
	if err := d.stopWorkers(rep); err != nil {
		return rep, err
	}
	if err := checkNoMessagesLeft(ctx, db, flows); err != nil {
		return rep, err
	}
	return rep, nil
}

// drainer is one Drain: its flows, one worker per flow, and what the
// workers could not complete.
type drainer struct {
	db    *DB
	opts  DrainOptions
	flows []drainFlow

	workers []*worker.Worker // started; nil once all stopped cleanly

	mu       sync.Mutex
	problems []string // tasks not completed, with why
}

// startWorkers starts one worker per flow.
func (d *drainer) startWorkers(ctx context.Context) error {
	for _, f := range d.flows {
		w, err := d.newWorker(f)
		if err != nil {
			return fmt.Errorf("drain: configuring the worker of flow %q: %w", f.def.Slug, err)
		}
		if err := w.Start(ctx); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		d.workers = append(d.workers, w)
	}
	return nil
}

// newWorker is f's worker: handlers that succeed, a step feeding a map
// returning a two-element array; any task it does not complete is recorded
// as a problem.
func (d *drainer) newWorker(f drainFlow) (*worker.Worker, error) {
	handlers := map[string]worker.HandlerFunc{}
	for _, st := range f.def.Steps {
		arr := f.feedsMap[st.Slug] && st.Type != worker.StepMap
		handlers[st.Slug] = func(context.Context, *worker.Task) (any, error) {
			if arr {
				return json.RawMessage(`[0, 1]`), nil
			}
			return map[string]any{"drained": true}, nil
		}
	}
	return worker.New(d.db.Pool, worker.Config{
		Flow: f.def, Handlers: handlers, Concurrency: 4, BatchSize: 20,
		VisibilityTimeout: 30 * time.Second, MaxPollSeconds: 1,
		PollInterval: 20 * time.Millisecond, HeartbeatInterval: time.Second,
		ShutdownTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, Logger: quiet,
		OnResult: func(r worker.Result) {
			if r.Outcome != worker.OutcomeCompleted || r.Err != nil {
				d.mu.Lock()
				d.problems = append(d.problems, fmt.Sprintf("%s/%s[%d] %s: %v", r.Task.RunID, r.Task.StepSlug, r.Task.TaskIndex, r.Outcome, r.Err))
				d.mu.Unlock()
			}
		},
	})
}

// waitForRuns polls until no run that can finish is still started, failing
// at the first task not completed, the first worker that stops, or the
// timeout. rep.Stuck is the last poll's runs that cannot finish.
func (d *drainer) waitForRuns(ctx context.Context, rep *DrainReport) error {
	for {
		d.mu.Lock()
		nProblems := len(d.problems)
		d.mu.Unlock()
		if nProblems > 0 {
			return fmt.Errorf("drain: tasks the new worker could not finish: %s", strings.Join(d.problems, "; "))
		}
		for _, w := range d.workers {
			select {
			case <-w.Done():
				return fmt.Errorf("drain: worker of queue %q stopped early: %v", w.Queue(), w.Err())
			default:
			}
		}
		open, stuck, err := openRuns(ctx, d.db)
		if err != nil {
			return err
		}
		rep.Stuck = stuck
		if open == 0 {
			return nil
		}
		if d.opts.FastForward {
			// Steps started during the drain may have a start delay: only
			// queued tasks' messages, never a lease the workers hold.
			if err := fastForward(ctx, d.db, d.flows, true); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d runs still started after %s: %w", open, d.opts.Timeout, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopWorkers stops the workers one by one, adding their counts to rep; a
// worker that failed a task or a write fails the drain.
func (d *drainer) stopWorkers(rep *DrainReport) error {
	for _, w := range d.workers {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := w.Stop(stopCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		st := w.Stats()
		rep.Claimed += int(st.Claimed)
		rep.Completed += int(st.Completed)
		if st.Failed > 0 || st.WriteErrors > 0 {
			return fmt.Errorf("drain: worker of queue %q: %d failed tasks, %d write errors (%v)", w.Queue(), st.Failed, st.WriteErrors, w.Err())
		}
	}
	d.workers = nil
	return nil
}

// stopAll stops every worker still held, ignoring errors: the drain has
// already failed.
func (d *drainer) stopAll() {
	for _, w := range d.workers {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = w.Stop(stopCtx)
		cancel()
	}
}

// checkNoMessagesLeft fails when a queue holds a message of no unfinished
// run: every message of a finished run must have been archived.
func checkNoMessagesLeft(ctx context.Context, db *DB, flows []drainFlow) error {
	for _, f := range flows {
		var left int
		q := `select count(*) from ` + pgx.Identifier{"pgmq", "q_" + strings.ToLower(f.queue)}.Sanitize() + ` m
		      where not exists (select 1 from pgflow.step_tasks t join pgflow.runs r on r.run_id = t.run_id
		                        where t.queue_name = $1 and t.message_id = m.msg_id and r.status = 'started')`
		if err := db.Pool.QueryRow(ctx, q, f.queue).Scan(&left); err != nil {
			return fmt.Errorf("drain: counting messages left in %q: %w", f.queue, err)
		}
		if left > 0 {
			return fmt.Errorf("drain: %d messages left in queue %q that belong to no unfinished run", left, f.queue)
		}
	}
	return nil
}

func loadFlows(ctx context.Context, db *DB) ([]drainFlow, error) {
	rows, err := db.Pool.Query(ctx, `
		select f.flow_slug, pg_catalog.lower(f.flow_slug), s.step_slug, s.step_type, s.when_unmet, s.when_exhausted,
		       s.required_input_pattern, s.forbidden_input_pattern,
		       coalesce((select array_agg(d.dep_slug order by p.step_index) from pgflow.deps d
		                 join pgflow.steps p on p.flow_slug = d.flow_slug and p.step_slug = d.dep_slug
		                 where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'),
		       exists (select 1 from pgflow.deps d join pgflow.steps c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
		               where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug and c.step_type = 'map')
		from pgflow.flows f join pgflow.steps s on s.flow_slug = f.flow_slug
		order by f.flow_slug, s.step_index`)
	if err != nil {
		return nil, fmt.Errorf("drain: reading the flows: %w", err)
	}
	defer rows.Close()
	var out []drainFlow
	for rows.Next() {
		var slug, queue, step, typ, unmet, exhausted string
		var req, forb []byte
		var deps []string
		var feeds bool
		if err := rows.Scan(&slug, &queue, &step, &typ, &unmet, &exhausted, &req, &forb, &deps, &feeds); err != nil {
			return nil, fmt.Errorf("drain: reading the flows: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].def.Slug != slug {
			out = append(out, drainFlow{def: worker.Flow{Slug: slug}, queue: queue, feedsMap: map[string]bool{}})
		}
		f := &out[len(out)-1]
		f.def.Steps = append(f.def.Steps, worker.Step{
			Slug: step, Type: worker.StepType(typ), DependsOn: deps, WhenUnmet: unmet, WhenExhausted: exhausted,
			RequiredInputPattern: rawOrNil(req), ForbiddenInputPattern: rawOrNil(forb),
		})
		f.feedsMap[step] = feeds
	}
	return out, rows.Err()
}

func rawOrNil(b []byte) json.RawMessage {
	if b == nil {
		return nil
	}
	return json.RawMessage(b)
}

// fastForward makes the invisible messages of the flows' queues visible:
// all of them, or (queuedOnly) those of queued tasks.
func fastForward(ctx context.Context, db *DB, flows []drainFlow, queuedOnly bool) error {
	if !queuedOnly {
		// A task a 0.16.0 worker held when the upgrade ran stays 'started':
		// pgflow never claims a started task again; requeue_stalled_tasks
		// (a cron every 15 s) takes it back once its lease is long past.
		// Age those leases, and run it as the cron would.
		if _, err := db.Pool.Exec(ctx, `update pgflow.step_tasks
			set queued_at = queued_at - interval '1 day', started_at = started_at - interval '1 day'
			where status = 'started' and permanently_stalled_at is null`); err != nil {
			return fmt.Errorf("drain: ageing the leases of tasks started before the upgrade: %w", err)
		}
		if _, err := db.Pool.Exec(ctx, `select pgflow.requeue_stalled_tasks()`); err != nil {
			return fmt.Errorf("drain: requeue_stalled_tasks: %w", err)
		}
	}
	for _, f := range flows {
		q := `select count(*) from (select pgmq.set_vt($1, m.msg_id, 0) from ` +
			pgx.Identifier{"pgmq", "q_" + strings.ToLower(f.queue)}.Sanitize() + ` m where m.vt > clock_timestamp()
			and (not $2 or exists (select 1 from pgflow.step_tasks t
			                       where t.queue_name = $1 and t.message_id = m.msg_id and t.status = 'queued'))) x`
		if _, err := db.Pool.Exec(ctx, q, f.queue, queuedOnly); err != nil {
			return fmt.Errorf("drain: making the messages of %q visible: %w", f.queue, err)
		}
	}
	return nil
}

// openRuns counts started runs that can still finish, and lists the stuck ones.
func openRuns(ctx context.Context, db *DB) (int, []string, error) {
	var open int
	var stuck []string
	err := db.Pool.QueryRow(ctx, `
		select count(*) filter (where not x.stuck),
		       coalesce(array_agg(x.run_id::text order by x.run_id) filter (where x.stuck), '{}')
		from (select r.run_id, exists (select 1 from pgflow.step_tasks t
		                               where t.run_id = r.run_id and t.permanently_stalled_at is not null) as stuck
		      from pgflow.runs r where r.status = 'started') x`).Scan(&open, &stuck)
	if err != nil {
		return 0, nil, fmt.Errorf("drain: counting unfinished runs: %w", err)
	}
	return open, stuck, nil
}

// mustJSON is for small literals in scenarios.
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
