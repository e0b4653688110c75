package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// Task is what a handler gets: the claimed task plus the worker that runs it.
type Task struct {
	ClaimedTask
	WorkerID string

	db        Querier
	flowMu    sync.Mutex
	flowInput json.RawMessage // the claim's, or read once from pgflow.runs
}

// DecodeInput unmarshals the task's input into v.
func (t *Task) DecodeInput(v any) error {
	if err := json.Unmarshal(t.Input, v); err != nil {
		return fmt.Errorf("decoding input of %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err)
	}
	return nil
}

// LoadFlowInput returns the run's input. The claim carries it only for root
// single steps; for the others it is read from pgflow.runs.input on first
// use (once per task), as upstream's worker does when a handler asks for
// ctx.flowInput. Handlers that never ask cost no query.
func (t *Task) LoadFlowInput(ctx context.Context) (json.RawMessage, error) {
	t.flowMu.Lock()
	defer t.flowMu.Unlock()
	if t.flowInput != nil {
		return t.flowInput, nil
	}
	if t.db == nil {
		return nil, fmt.Errorf("reading the flow input of run %s: the task is not attached to a worker", t.RunID)
	}
	var raw []byte
	if err := t.db.QueryRow(ctx, `select r.input from pgflow.runs r where r.run_id = $1::uuid`, t.RunID).Scan(&raw); err != nil {
		return nil, fmt.Errorf("reading the flow input of run %s from pgflow.runs: %w", t.RunID, err)
	}
	t.flowInput = rawJSON(raw)
	return t.flowInput, nil
}

// DecodeFlowInput unmarshals the run's input (LoadFlowInput) into v.
func (t *Task) DecodeFlowInput(ctx context.Context, v any) error {
	raw, err := t.LoadFlowInput(ctx)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decoding flow input of run %s: %w", t.RunID, err)
	}
	return nil
}

func taskAttrs(t ClaimedTask) slog.Attr {
	return slog.Group("task",
		slog.String("queue_name", t.QueueName), slog.Int64("msg_id", t.MessageID),
		slog.String("run_id", t.RunID), slog.String("step_slug", t.StepSlug),
		slog.Int("task_index", t.TaskIndex))
}

func (w *Worker) runTask(t ClaimedTask) {
	defer w.inflight.Done()
	handled := false
	defer func() {
		w.freeSlots(1)
		if handled {
			w.pastHandler.Add(-1) // after the slot is free: linger never sees it held by nobody
		}
	}()

	ctx, cancel := context.WithCancel(w.workCtx)
	out, err, panicked := w.callHandler(ctx, t)
	cancel()
	handled = true
	w.pastHandler.Add(1)

	switch {
	case err == nil:
		w.complete(t, out)
	case w.workCtx.Err() != nil && !panicked:
		// The handler gave up because we cancelled it: not a failure, and,
		// as upstream on an abort, neither call is sent.
		w.n.abandoned.Add(1)
		w.log.LogAttrs(context.Background(), slog.LevelWarn, "task cancelled by a stop: nothing written; it stays started until requeue_stalled_tasks takes it back after its visibility timeout", taskAttrs(t))
		w.report(Result{Task: t, Outcome: OutcomeAbandoned, Err: err})
	default:
		w.fail(t, err, panicked)
	}
}

func (w *Worker) callHandler(ctx context.Context, t ClaimedTask) (out any, err error, panicked bool) {
	h := w.cfg.Handlers[t.StepSlug]
	if h == nil {
		// Validation makes this impossible for the configured route; a task
		// of another step still must not vanish.
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
	task := &Task{ClaimedTask: t, WorkerID: w.cfg.WorkerID, db: w.pool, flowInput: t.FlowInput}
	out, err = h(ctx, task)
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
	status, err := w.writeOutcome(
		`select coalesce((select c.status from pgflow.complete_task($1::uuid, $2::text, $3::integer, $4::jsonb) c), 'missing')`,
		t.RunID, t.StepSlug, t.TaskIndex, output)
	if err != nil {
		w.writeFailed(t, fmt.Errorf("completing task %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err))
		return
	}
	w.n.completed.Add(1)
	if status != "completed" {
		// A late completion (the run failed, the step was skipped): the
		// engine archived the message and kept its state.
		w.log.LogAttrs(w.hardCtx, slog.LevelInfo, "completion not applied", taskAttrs(t), slog.String("task_status", status))
	}
	w.report(Result{Task: t, Outcome: OutcomeCompleted})
}

// fail sends the error's message as fail_task's error_message (upstream
// sends an Error's message).
func (w *Worker) fail(t ClaimedTask, herr error, panicked bool) {
	msg := herr.Error()
	status, err := w.writeOutcome(
		`select coalesce((select f.status from pgflow.fail_task($1::uuid, $2::text, $3::integer, $4::text) f), 'missing')`,
		t.RunID, t.StepSlug, t.TaskIndex, msg)
	if err != nil {
		w.writeFailed(t, fmt.Errorf("failing task %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err))
		return
	}
	w.n.failed.Add(1)
	w.log.LogAttrs(w.hardCtx, slog.LevelWarn, "task failed", taskAttrs(t),
		slog.String("error", msg), slog.Bool("panicked", panicked), slog.String("task_status", status))
	w.report(Result{Task: t, Outcome: OutcomeFailed, Panicked: panicked, Err: herr})
}

// writeOutcome runs one outcome call (complete_task or fail_task, selecting
// the task's status) on writeCtx and folds its round trip into writeNanos
// (see writeWait).
func (w *Worker) writeOutcome(sql string, args ...any) (status string, err error) {
	ctx, cancel := w.writeCtx()
	defer cancel()
	began := time.Now()
	err = w.pool.QueryRow(ctx, sql, args...).Scan(&status)
	w.observeWrite(time.Since(began))
	return status, err
}

// writeFailed: the outcome could not be written. The task stays started with
// its message invisible until its visibility timeout; then
// pgflow.requeue_stalled_tasks puts it back: delayed, not lost.
func (w *Worker) writeFailed(t ClaimedTask, err error) {
	w.n.writeErrors.Add(1)
	w.n.abandoned.Add(1)
	w.log.LogAttrs(context.Background(), slog.LevelError, "writing task outcome failed; requeue_stalled_tasks takes the task back after its visibility timeout",
		taskAttrs(t), slog.Any("error", err))
	w.report(Result{Task: t, Outcome: OutcomeAbandoned, Err: err})
}
