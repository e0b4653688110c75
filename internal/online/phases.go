package online

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgretry"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// expand: one short transaction. Our schema first (no pgflow lock), then
// ACCESS EXCLUSIVE on steps and step_tasks (in the documented order) under
// lock_timeout: ADD COLUMN without a default is a catalog change, and so are
// the triggers, so the locks are held for milliseconds.
func (e *engine) expand(ctx context.Context) error {
	if err := e.hook(ctx, PointExpand); err != nil {
		return err
	}
	// Our own objects first, in a transaction that locks no pgflow table.
	if err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, progressDDL); err != nil {
			return fmt.Errorf("online expand: creating pgflow_upgrade.online_progress and the trigger function: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	return e.ddlTx(ctx, "expand", func(tx pgx.Tx) error {
		st, err := upgrade.DetectState(ctx, tx)
		if err != nil {
			return err
		}
		if !baselineOrOnline(st) {
			e.rep.Outcome = upgrade.OutcomeRefused
			return fmt.Errorf("%w: %w: state %s", ErrRefused, upgrade.ErrNotBaseline, st.State)
		}
		restart := false
		for _, t := range Tables {
			if _, err := tx.Exec(ctx, `lock table pgflow.`+t+` in access exclusive mode`); err != nil {
				return fmt.Errorf("online expand: lock table pgflow.%s: %w", t, err)
			}
		}
		for _, t := range Tables {
			var col, trg bool
			if err := tx.QueryRow(ctx, `
				select exists (select 1 from pg_catalog.pg_attribute a where a.attrelid = $1::pg_catalog.regclass and a.attname = 'queue_name' and not a.attisdropped),
				       exists (select 1 from pg_catalog.pg_trigger g where g.tgrelid = $1::pg_catalog.regclass and g.tgname = $2 and not g.tgisinternal)`,
				"pgflow."+t, TriggerName).Scan(&col, &trg); err != nil {
				return fmt.Errorf("online expand: reading pgflow.%s: %w", t, err)
			}
			if !col {
				if _, err := tx.Exec(ctx, `alter table pgflow.`+t+` add column queue_name text`); err != nil {
					return fmt.Errorf("online expand: adding pgflow.%s.queue_name: %w", t, err)
				}
			}
			if !trg {
				// Rows inserted while the trigger was missing (it was dropped by
				// hand) have no queue_name: the backfill starts over then.
				restart = restart || col
				if _, err := tx.Exec(ctx, `create trigger `+TriggerName+` before insert on pgflow.`+t+`
					for each row execute function `+TriggerFunc+`()`); err != nil {
					return fmt.Errorf("online expand: creating the insert trigger on pgflow.%s: %w", t, err)
				}
			}
		}
		// reltuples: an estimate, for progress only (-1: never analyzed).
		if _, err := tx.Exec(ctx, `
			insert into pgflow_upgrade.online_progress (phase, rows_total)
			select 'backfill', greatest(c.reltuples, 0)::bigint from pg_catalog.pg_class c
			where c.oid = 'pgflow.step_tasks'::pg_catalog.regclass
			on conflict (id) do update set phase = 'backfill', updated_at = pg_catalog.now()`); err != nil {
			return fmt.Errorf("online expand: recording progress: %w", err)
		}
		if restart {
			if _, err := tx.Exec(ctx, `update pgflow_upgrade.online_progress
				set last_run_id = null, last_step_slug = null, last_task_index = null, pass = pass + 1 where id`); err != nil {
				return fmt.Errorf("online expand: restarting the backfill: %w", err)
			}
		}
		return nil
	})
}

// The start key of a pass: below every real key (” sorts before any slug).
const zeroUUID = "00000000-0000-0000-0000-000000000000"

type key struct {
	runID, step string
	index       int32
}

var startKey = key{zeroUUID, "", -1 << 31}

// backfill fills steps.queue_name (backfillSteps), then
// step_tasks.queue_name in primary-key order. Each batch is one short
// transaction that also records its end key, so after a kill the next run
// starts exactly after the last committed batch. Rows an application
// transaction holds are skipped (SKIP LOCKED: the backfill never waits for
// the application, so it can never be in a deadlock with it) and the same
// range is retried; a pass that ends with rows still NULL anywhere is
// followed by another.
func (e *engine) backfill(ctx context.Context) error {
	if err := e.backfillSteps(ctx); err != nil {
		return err
	}
	p, _, err := ReadProgress(ctx, e.conn)
	if err != nil {
		return err
	}
	k := startKey
	if p.LastRunID != nil && p.LastStepSlug != nil && p.LastTaskIndex != nil {
		k = key{*p.LastRunID, *p.LastStepSlug, *p.LastTaskIndex}
	}
	pass := int(p.Pass)
	done := p.RowsDone
	sz := &sizer{size: min(1000, e.opts.BatchSize), max: e.opts.BatchSize, target: e.opts.BatchTime}
	th := &throttle{maxRate: e.opts.MaxRate, pause: e.opts.Pause, start: time.Now()}
	start := time.Now()
	retries := 0
	lastReport := time.Time{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := e.waitReplicas(ctx); err != nil {
			return err
		}
		if err := e.hook(ctx, PointBatch); err != nil {
			return err
		}
		t := time.Now()
		b, err := e.batch(ctx, k, sz.size)
		took := time.Since(t)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil && sz.size > minBatch {
				sz.size = max(sz.size/4, minBatch) // statement_timeout: much smaller, again
				continue
			}
			return err
		}
		e.rep.Backfill.Batches++
		e.rep.Backfill.Rows += b.updated
		e.rep.Backfill.LongestMS = max(e.rep.Backfill.LongestMS, took.Milliseconds())
		done += b.updated
		skipped := b.nulls - b.updated
		if skipped > 0 {
			e.rep.Backfill.SkippedLocked += skipped
		}
		// Advance past the range unless rows were skipped (retry it soon:
		// application transactions are short), at most 20 times.
		advance := skipped <= 0 || retries >= 20
		if advance {
			retries = 0
			if b.end != nil {
				k = *b.end
			}
		} else {
			retries++
		}
		elapsed := time.Since(start).Seconds()
		rate := 0.0
		if elapsed > 0 {
			rate = float64(e.rep.Backfill.Rows) / elapsed
		}
		e.rep.Backfill.Rate = rate
		var saveKey *key
		if advance && b.end != nil {
			saveKey = &k
		}
		if err := e.saveProgress(ctx, b, saveKey, rate); err != nil {
			return err
		}
		if time.Since(lastReport) > time.Second || (advance && b.end == nil) {
			lastReport = time.Now()
			e.event(Event{Phase: PhaseBackfill, Detail: fmt.Sprintf("pass %d, batch of %d", pass, sz.size), Rows: done, Total: p.RowsTotal, Rate: rate})
		}
		if advance && b.end == nil {
			// End of the pass: anything still NULL (skipped for good, or
			// inserted while the trigger was missing) gets another pass.
			var left bool
			if err := e.conn.QueryRow(ctx, `select exists (select 1 from pgflow.step_tasks t where t.queue_name is null)`).Scan(&left); err != nil {
				return fmt.Errorf("online backfill: looking for rows still without queue_name: %w", err)
			}
			e.rep.Backfill.Passes++
			if !left {
				return setPhase(ctx, e.conn, PhaseContract)
			}
			pass++
			k = startKey
			if _, err := e.conn.Exec(ctx, `update pgflow_upgrade.online_progress
				set last_run_id = null, last_step_slug = null, last_task_index = null, pass = $1 where id`, pass); err != nil {
				return fmt.Errorf("online backfill: starting pass %d: %w", pass, err)
			}
			continue
		}
		sz.next(took)
		if err := pgretry.Sleep(ctx, th.delay(time.Now(), b.updated)); err != nil {
			return err
		}
	}
}

type batchResult struct {
	end     *key // the range's last key; nil: the range ran to the end of the table
	updated int64
	nulls   int64 // NULL rows in the range as the statement saw them (updated + skipped)
	tx      pgx.Tx
}

// batch fills the range (k, k+size] in one transaction, which stays open
// for saveProgress to record the result in.
func (e *engine) batch(ctx context.Context, k key, size int) (*batchResult, error) {
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("online backfill: begin: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	// A batch never waits for a row lock (SKIP LOCKED); the timeouts only
	// bound a batch that is slower than it should be (then it gets smaller).
	st := max(20*e.opts.BatchTime, 5*time.Second)
	// The batch is a key range: index scans and nested loops by primary
	// key, never a hash join over the whole table (the planner's estimate
	// of a row-comparison range is poor, and a wrong guess costs a scan of
	// millions of rows per batch).
	if _, err := tx.Exec(ctx, `select pg_catalog.set_config('statement_timeout', $1, true),
	                                  pg_catalog.set_config('lock_timeout', $2, true),
	                                  pg_catalog.set_config('enable_seqscan', 'off', true),
	                                  pg_catalog.set_config('enable_hashjoin', 'off', true),
	                                  pg_catalog.set_config('enable_mergejoin', 'off', true),
	                                  pg_catalog.set_config('idle_in_transaction_session_timeout', $3, true)`, pgretry.Millis(st), pgretry.Millis(e.opts.LockTimeout), pgretry.Millis(idleTimeout)); err != nil {
		return nil, fmt.Errorf("online backfill: setting timeouts: %w", err)
	}
	b := &batchResult{tx: tx}
	var end key
	err = tx.QueryRow(ctx, `
		select t.run_id::text, t.step_slug, t.task_index from pgflow.step_tasks t
		where (t.run_id, t.step_slug, t.task_index) > ($1::uuid, $2::text, $3::integer)
		order by t.run_id, t.step_slug, t.task_index
		offset $4 limit 1`, k.runID, k.step, k.index, size-1).Scan(&end.runID, &end.step, &end.index)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Fewer than size rows left: this range runs to the end.
	case err != nil:
		return nil, fmt.Errorf("online backfill: finding the end of the batch after (%s, %s, %d): %w", k.runID, k.step, k.index, err)
	default:
		b.end = &end
	}
	// One statement: lock the range's NULL rows that no one holds, fill
	// them, and count the NULL rows the statement's snapshot saw in the range.
	var q string
	args := []any{k.runID, k.step, k.index}
	if b.end != nil {
		q = `with l as materialized (
		       select t.run_id, t.step_slug, t.task_index from pgflow.step_tasks t
		       where (t.run_id, t.step_slug, t.task_index) > ($1::uuid, $2::text, $3::integer)
		         and (t.run_id, t.step_slug, t.task_index) <= ($4::uuid, $5::text, $6::integer)
		         and t.queue_name is null
		       for update of t skip locked),
		     u as (
		       update pgflow.step_tasks t set queue_name = pg_catalog.lower(t.flow_slug)
		       from l where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
		       returning 1)
		     select (select pg_catalog.count(*) from u),
		            (select pg_catalog.count(*) from pgflow.step_tasks t
		             where (t.run_id, t.step_slug, t.task_index) > ($1::uuid, $2::text, $3::integer)
		               and (t.run_id, t.step_slug, t.task_index) <= ($4::uuid, $5::text, $6::integer)
		               and t.queue_name is null)`
		args = append(args, end.runID, end.step, end.index)
	} else {
		q = `with l as materialized (
		       select t.run_id, t.step_slug, t.task_index from pgflow.step_tasks t
		       where (t.run_id, t.step_slug, t.task_index) > ($1::uuid, $2::text, $3::integer)
		         and t.queue_name is null
		       for update of t skip locked),
		     u as (
		       update pgflow.step_tasks t set queue_name = pg_catalog.lower(t.flow_slug)
		       from l where t.run_id = l.run_id and t.step_slug = l.step_slug and t.task_index = l.task_index
		       returning 1)
		     select (select pg_catalog.count(*) from u),
		            (select pg_catalog.count(*) from pgflow.step_tasks t
		             where (t.run_id, t.step_slug, t.task_index) > ($1::uuid, $2::text, $3::integer)
		               and t.queue_name is null)`
	}
	if err := tx.QueryRow(ctx, q, args...).Scan(&b.updated, &b.nulls); err != nil {
		return nil, fmt.Errorf("online backfill: filling the batch after (%s, %s, %d): %w", k.runID, k.step, k.index, err)
	}
	ok = true
	return b, nil
}

// saveProgress records the batch in its own transaction and commits both.
func (e *engine) saveProgress(ctx context.Context, b *batchResult, k *key, rate float64) error {
	defer b.tx.Rollback(context.WithoutCancel(ctx))
	var err error
	if k != nil {
		_, err = b.tx.Exec(ctx, `update pgflow_upgrade.online_progress
			set last_run_id = $1::uuid, last_step_slug = $2, last_task_index = $3,
			    rows_done = rows_done + $4, batches = batches + 1, rate = $5, updated_at = pg_catalog.now()
			where id`, k.runID, k.step, k.index, b.updated, rate)
	} else {
		_, err = b.tx.Exec(ctx, `update pgflow_upgrade.online_progress
			set rows_done = rows_done + $1, batches = batches + 1, rate = $2, updated_at = pg_catalog.now()
			where id`, b.updated, rate)
	}
	if err != nil {
		return fmt.Errorf("online backfill: recording progress: %w", err)
	}
	if err := b.tx.Commit(ctx); err != nil {
		return fmt.Errorf("online backfill: committing a batch: %w", err)
	}
	return nil
}

// waitReplicas holds the backfill while a standby lags more than the limit.
func (e *engine) waitReplicas(ctx context.Context) error {
	if e.opts.MaxReplicaLag < 0 {
		return nil
	}
	for {
		lags, err := replicaLags(ctx, e.conn)
		if err != nil {
			return err
		}
		wait, worst := lagDecision(lags, e.opts.MaxReplicaLag)
		if !wait {
			return nil
		}
		e.event(Event{Phase: PhaseBackfill, Detail: fmt.Sprintf("waiting: replica %q replay lag %s > --max-replica-lag %s", worst.Name, worst.Lag.Round(time.Millisecond), e.opts.MaxReplicaLag)})
		t := time.Now()
		if err := pgretry.Sleep(ctx, time.Second); err != nil {
			return err
		}
		e.rep.Backfill.ReplicaWaitMS += time.Since(t).Milliseconds()
	}
}
