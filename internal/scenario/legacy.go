package scenario

// The scenarios about 0.16.0 workers: rejected after the upgrade, and
// running while it happens.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
)

// oldFlow is the flow the old-worker scenarios run: a → b.
var oldFlow = oldworker.Flow{
	Slug:    "legacy",
	Options: oldworker.Options{MaxAttempts: oldworker.Int(3), BaseDelay: oldworker.Int(0), Timeout: oldworker.Int(1)},
	Steps:   []oldworker.Step{{Slug: "a"}, {Slug: "b", DependsOn: []string{"a"}}},
}

func oldHandlers(block <-chan struct{}) map[string]oldworker.Handler {
	h := func(ctx context.Context, t oldworker.Task) (any, error) {
		if block != nil {
			select {
			case <-block:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{"step": t.StepSlug}, nil
	}
	return map[string]oldworker.Handler{"a": h, "b": h}
}

// startLegacy compiles and starts the legacy flow with a 0.16.0 worker that
// then stops, and starts n runs.
func startLegacy(ctx context.Context, db *DB, n int) error {
	w := oldworker.New(db.Pool, oldworker.Config{FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(nil), Logger: quiet})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("0.16.0 worker before the upgrade: %w", err)
	}
	if err := w.Stop(ctx); err != nil {
		return err
	}
	for i := range n {
		if _, err := db.Pool.Exec(ctx, `select count(*) from pgflow.start_flow($1, $2::jsonb)`, oldFlow.Slug, mustJSON(map[string]int{"i": i})); err != nil {
			return fmt.Errorf("start_flow: %w", err)
		}
	}
	return nil
}

func oldWorkerAfterUpgrade(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if err := startLegacy(ctx, db, 2); err != nil {
		return err
	}
	if _, err := survive(ctx, env, db); err != nil {
		return err
	}
	queued := `select count(*) from pgflow.step_tasks where flow_slug = $1 and status = 'queued' and attempts_count = 0`
	queuedBefore, err := CountRows(ctx, db, queued, oldFlow.Slug)
	if err != nil {
		return err
	}
	// 0.17.0: its two-argument compile resolves to the four-argument
	// ensure_flow_compiled through the defaults ('verified'), so it starts
	// and registers; its first non-empty claim fails with 42883.
	w := oldworker.New(db.Pool, oldworker.Config{FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(nil),
		VisibilityTimeout: 1, Logger: quiet})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("a 0.16.0 worker must still start on 0.17.0 (its compile resolves through the defaults): %w", err)
	}
	defer w.Stop(context.WithoutCancel(ctx))
	registered, err := CountRows(ctx, db, `select count(*) from pgflow.workers where worker_id = $1::uuid`, w.ID())
	if err != nil {
		return err
	}
	if registered != 1 {
		return errorf("the 0.16.0 worker did not register (%d rows): 0.17.0 lets it register before its claim fails", registered)
	}
	_, claimErr := w.PollOnce(ctx)
	if code := SQLState(claimErr); code != UndefinedFunction || !strings.Contains(claimErr.Error(), "start_tasks") {
		return fmt.Errorf("the 0.16.0 worker's first claim: SQLSTATE %q, want %s at start_tasks: %w", code, UndefinedFunction, claimErr)
	}
	queuedAfter, err := CountRows(ctx, db, queued, oldFlow.Slug)
	if err != nil {
		return err
	}
	if queuedAfter != queuedBefore || queuedAfter == 0 {
		return errorf("the failed claim changed tasks: %d queued and never attempted before, %d after", queuedBefore, queuedAfter)
	}
	claimedBy, err := CountRows(ctx, db, `select count(*) from pgflow.step_tasks where last_worker_id = $1::uuid or status = 'started'`, w.ID())
	if err != nil {
		return err
	}
	if claimedBy != 0 {
		return errorf("the failed claim left %d tasks started or attributed to the 0.16.0 worker", claimedBy)
	}
	// It still heartbeats: 0.17.0 keeps pgflow.workers as 0.16.0 had it.
	if _, err := db.Pool.Exec(ctx, `update pgflow.workers set last_heartbeat_at = now() - interval '1 hour' where worker_id = $1::uuid`, w.ID()); err != nil {
		return err
	}
	if _, err := w.Heartbeat(ctx); err != nil {
		return fmt.Errorf("the 0.16.0 worker's heartbeat after the upgrade: %w", err)
	}
	fresh, err := CountRows(ctx, db, `select count(*) from pgflow.workers where worker_id = $1::uuid and last_heartbeat_at > now() - interval '1 minute'`, w.ID())
	if err != nil {
		return err
	}
	if fresh != 1 {
		return errorf("the 0.16.0 worker's heartbeat did not update its row after the upgrade")
	}
	// The messages its claim read (vt 1 s) become visible again.
	if err := waitFor(ctx, 15*time.Second, func() (bool, error) {
		n, err := CountRows(ctx, db, `select count(*) from pgmq.q_legacy where vt > clock_timestamp()`)
		return n == 0, err
	}); err != nil {
		return fmt.Errorf("waiting for the messages read by the rejected claim to become visible: %w", err)
	}
	env.Notef("registered and heartbeats, then rejected at its first claim: %s", firstLine(claimErr.Error()))
	return nil
}

func oldWorkerDuringUpgrade(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	const runs = 4
	if err := startLegacy(ctx, db, runs); err != nil {
		return err
	}
	release := make(chan struct{})
	w := oldworker.New(db.Pool, oldworker.Config{
		FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(release),
		BatchSize: 2, VisibilityTimeout: 1, MaxPollSeconds: 1, Logger: quiet,
	})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("0.16.0 worker before the upgrade: %w", err)
	}
	// First claim before the upgrade: two tasks are in its handlers (started,
	// messages invisible) while the upgrade runs.
	first := make(chan error, 1)
	go func() {
		n, err := w.PollOnce(ctx)
		if err == nil && n != 2 {
			err = fmt.Errorf("first poll started %d tasks, want 2", n)
		}
		first <- err
	}()
	if err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		n, err := CountRows(ctx, db, `select count(*) from pgflow.step_tasks where status = 'started'`)
		return n == 2, err
	}); err != nil {
		close(release)
		return fmt.Errorf("waiting for the 0.16.0 worker to start two tasks: %w", err)
	}
	_, upErr := env.Upgrade(ctx, db)
	close(release) // the handlers finish: complete_task exists after the upgrade too
	if upErr != nil {
		<-first
		return fmt.Errorf("the upgrade failed with a 0.16.0 worker running: %w", upErr)
	}
	if err := <-first; err != nil {
		return fmt.Errorf("the 0.16.0 worker's in-flight batch: %w", err)
	}
	// Its next claim reads messages (pgmq still works) and fails at start_tasks.
	n, err := w.PollOnce(ctx)
	if err == nil {
		return errorf("the 0.16.0 worker's claim after the upgrade succeeded (%d tasks)", n)
	}
	if code := SQLState(err); code != UndefinedFunction || !strings.Contains(err.Error(), "start_tasks") {
		return fmt.Errorf("the 0.16.0 worker's claim failed with SQLSTATE %q, want %s at start_tasks: %w", code, UndefinedFunction, err)
	}
	env.Notef("0.16.0 claim: %s", firstLine(err.Error()))
	// Nothing lost: every unfinished task still has its message in its queue.
	lost, err := CountRows(ctx, db, `select count(*) from pgflow.step_tasks t
		where t.status in ('queued', 'started') and not exists (select 1 from pgmq.q_legacy m where m.msg_id = t.message_id)`)
	if err != nil {
		return err
	}
	if lost > 0 {
		return errorf("%d unfinished tasks lost their message", lost)
	}
	// The messages it read become visible again once their 1 s vt passes.
	if err := waitFor(ctx, 15*time.Second, func() (bool, error) {
		n, err := CountRows(ctx, db, `select count(*) from pgmq.q_legacy where vt > clock_timestamp()`)
		return n == 0, err
	}); err != nil {
		return fmt.Errorf("waiting for the messages read by the rejected 0.16.0 claim to become visible: %w", err)
	}
	rep, err := Drain(ctx, db, DrainOptions{})
	if err != nil {
		return err
	}
	done, err := CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'completed'`)
	if err != nil {
		return err
	}
	if done != runs {
		return errorf("%d of %d runs completed after the drain", done, runs)
	}
	env.Notef("new worker completed %d tasks", rep.Completed)
	return nil
}
