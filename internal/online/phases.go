package online

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgretry"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// expand: one short transaction. Our schema first (no pgflow lock), then
// ACCESS EXCLUSIVE on steps and step_tasks (in the documented order) under
// lock_timeout: ADD COLUMN without a default is a catalog change, and so are
// the triggers (INSERT, and UPDATE of a row still unfilled), so the locks
// are held for milliseconds.
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
		st, err := versions.DetectSchema(ctx, tx)
		if err != nil {
			return err
		}
		if !baselineOrOnline(st) {
			e.res.Outcome = outcome.Refused
			return fmt.Errorf("%w: %w: state %s", ErrRefused, upgrade.ErrNotBaseline, st.State)
		}
		restart := false
		e.lockWindowStarts()
		for _, t := range Tables {
			if _, err := tx.Exec(ctx, `lock table pgflow.`+t+` in access exclusive mode`); err != nil {
				return fmt.Errorf("online expand: lock table pgflow.%s: %w", t, err)
			}
		}
		for _, t := range Tables {
			var col, trg, full bool
			if err := tx.QueryRow(ctx, `
				select exists (select 1 from pg_catalog.pg_attribute a where a.attrelid = $1::pg_catalog.regclass and a.attname = 'queue_name' and not a.attisdropped),
				       exists (select 1 from pg_catalog.pg_trigger g where g.tgrelid = $1::pg_catalog.regclass and g.tgname = $2 and not g.tgisinternal),
				       exists (select 1 from pg_catalog.pg_trigger g where g.tgrelid = $1::pg_catalog.regclass and g.tgname = $2 and not g.tgisinternal
				                 and g.tgtype::int & 20 = 20)`,
				"pgflow."+t, TriggerName).Scan(&col, &trg, &full); err != nil {
				return fmt.Errorf("online expand: reading pgflow.%s: %w", t, err)
			}
			if trg && !full {
				// An earlier pgflow-upgrade's insert-only trigger: rows it let
				// through unfilled may sit behind the cursor, so the pass restarts.
				if _, err := tx.Exec(ctx, `drop trigger `+TriggerName+` on pgflow.`+t); err != nil {
					return fmt.Errorf("online expand: replacing the insert-only trigger on pgflow.%s: %w", t, err)
				}
				trg = false
			}
			if !col {
				if _, err := tx.Exec(ctx, `alter table pgflow.`+t+` add column queue_name text`); err != nil {
					return fmt.Errorf("online expand: adding pgflow.%s.queue_name: %w", t, err)
				}
			}
			if !trg {
				// Rows written while the trigger was missing (it was dropped by
				// hand) may have no queue_name: the backfill starts over then.
				restart = restart || col
				if _, err := tx.Exec(ctx, `create trigger `+TriggerName+` before insert or update on pgflow.`+t+`
					for each row when (new.queue_name is null) execute function `+TriggerFunc+`()`); err != nil {
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
				set next_block = 0, end_block = 0, pass = pass + 1 where id`); err != nil {
				return fmt.Errorf("online expand: restarting the backfill: %w", err)
			}
		}
		return nil
	})
}

// backfill fills steps.queue_name (backfillSteps), then
// step_tasks.queue_name in physical order: TID range scans over runs of
// blocks ([b, b+n), PostgreSQL 14+), so a batch reads only its own pages,
// with no index to walk and no range end to find first. Each batch is one
// short transaction that also records the next block, so after a kill the
// next run starts exactly after the last committed batch. Rows an
// application transaction holds are skipped (SKIP LOCKED: the backfill never
// waits for the application, so it can never be in a deadlock with it) and
// the same blocks are retried.
//
// A pass ends at the table's size when it began: rows written during the
// pass, wherever they land (behind the cursor too: an UPDATE writes its new
// version in any block with room), are filled already, by the backfill's
// own UPDATE or by the triggers (an INSERT, or an UPDATE of a row still
// unfilled). So a pass that swept every block from 0 without leaving a row
// skipped leaves no NULL; any other pass ends with one look for NULLs (a
// scan) and, if some are left, another pass. VALIDATE of the online check
// proves it.
func (e *engine) backfill(ctx context.Context) error {
	if err := e.backfillSteps(ctx); err != nil {
		return err
	}
	p, _, err := ReadProgress(ctx, e.conn)
	if err != nil {
		return err
	}
	blk, end := p.NextBlock, p.EndBlock
	if p.Phase == string(PhaseContract) {
		blk, end = 0, 0 // a finished backfill run again (VALIDATE found a NULL): a new pass
		p.Pass++
	}
	pass := int(p.Pass)
	e.rep.Backfill.Pass = pass
	clean := blk == 0 // this run sees the whole pass
	if end == 0 {
		if end, err = e.startPass(ctx, pass); err != nil {
			return err
		}
	}
	done := p.RowsDone
	rpb, err := rowsPerBlock(ctx, e.conn)
	if err != nil {
		return err
	}
	maxBlocks := max(1, int((float64(e.opts.BatchSize)+rpb-1)/rpb))
	sz := &sizer{size: min(max(1, int(1000/rpb)), maxBlocks), max: maxBlocks, target: e.opts.BatchTime}
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
		n := int64(sz.size)
		b, err := e.batch(ctx, blk, n)
		took := time.Since(t)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil && sz.size > 1 {
				sz.size = max(sz.size/4, 1) // statement_timeout: much smaller, again
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
		// Advance past the blocks unless rows were skipped (retry them soon:
		// application transactions are short), at most 20 times; rows
		// skipped for good make the pass unclean (a look for NULLs at its end).
		advance := skipped <= 0 || retries >= 20
		if advance {
			if skipped > 0 {
				clean = false
			}
			retries = 0
			blk += n
		} else {
			retries++
		}
		elapsed := time.Since(start).Seconds()
		rate := 0.0
		if elapsed > 0 {
			rate = float64(e.rep.Backfill.Rows) / elapsed
		}
		e.rep.Backfill.Rate = rate
		last := advance && blk >= end
		if err := e.saveProgress(ctx, b, blk, rate); err != nil {
			return err
		}
		if time.Since(lastReport) > time.Second || last {
			lastReport = time.Now()
			e.event(Event{Phase: PhaseBackfill, Detail: fmt.Sprintf("pass %d, block %d of %d, batch of %d blocks", pass, blk, end, n), Rows: done, Total: p.RowsTotal, Rate: rate})
		}
		if last {
			e.rep.Backfill.Passes++
			left := false
			if !clean {
				if err := e.conn.QueryRow(ctx, `select exists (select 1 from pgflow.step_tasks t where t.queue_name is null)`).Scan(&left); err != nil {
					return fmt.Errorf("online backfill: looking for rows still without queue_name: %w", err)
				}
			}
			if !left {
				return setPhase(ctx, e.conn, PhaseContract)
			}
			pass++
			blk, clean = 0, true
			if end, err = e.startPass(ctx, pass); err != nil {
				return err
			}
			continue
		}
		sz.next(took)
		if err := pgretry.Sleep(ctx, th.delay(time.Now(), b.updated)); err != nil {
			return err
		}
	}
}

// startPass records a new pass from block 0 to the table's present end.
func (e *engine) startPass(ctx context.Context, pass int) (end int64, err error) {
	if err := e.conn.QueryRow(ctx, `update pgflow_upgrade.online_progress
		set next_block = 0, pass = $1, phase = 'backfill',
		    end_block = pg_catalog.pg_relation_size('pgflow.step_tasks'::pg_catalog.regclass) / pg_catalog.current_setting('block_size')::bigint
		where id returning end_block`, pass).Scan(&end); err != nil {
		return 0, fmt.Errorf("online backfill: starting pass %d: %w", pass, err)
	}
	return end, nil
}

// rowsPerBlock estimates step_tasks rows per block from the statistics
// (50 when the table was never analyzed), to turn --batch-size rows into blocks.
func rowsPerBlock(ctx context.Context, q Querier) (float64, error) {
	var rpb float64
	if err := q.QueryRow(ctx, `select case when c.relpages > 0 and c.reltuples > 0 then c.reltuples / c.relpages else 50 end
		from pg_catalog.pg_class c where c.oid = 'pgflow.step_tasks'::pg_catalog.regclass`).Scan(&rpb); err != nil {
		return 0, fmt.Errorf("online backfill: reading the statistics of pgflow.step_tasks: %w", err)
	}
	return max(rpb, 1), nil
}

type batchResult struct {
	updated int64
	nulls   int64 // NULL rows in the blocks as the statement saw them (updated + skipped)
	tx      pgx.Tx
}

// tid is the first tuple address of block b ('(b,0)'; no tuple has offset 0).
func tid(b int64) string { return fmt.Sprintf("(%d,0)", b) }

// batch fills the blocks [blk, blk+n) in one transaction, which stays open
// for saveProgress to record the result in.
func (e *engine) batch(ctx context.Context, blk, n int64) (*batchResult, error) {
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
	if err := (session.Limits{Statement: st, Lock: e.opts.LockTimeout, IdleInTransaction: idleTimeout}).Set(ctx, tx); err != nil {
		return nil, fmt.Errorf("online backfill: setting timeouts: %w", err)
	}
	b := &batchResult{tx: tx}
	// One statement: lock the blocks' NULL rows that no one holds (TID range
	// scan), fill them by address (TID scan), and count the NULL rows the
	// statement's snapshot saw in the blocks. FOR UPDATE returns the address
	// of the row's latest version, which the UPDATE then finds.
	if err := tx.QueryRow(ctx, `
		with l as materialized (
		       select t.ctid from pgflow.step_tasks t
		       where t.ctid >= $1::pg_catalog.tid and t.ctid < $2::pg_catalog.tid and t.queue_name is null
		       for update of t skip locked),
		     u as (
		       update pgflow.step_tasks t set queue_name = pg_catalog.lower(t.flow_slug)
		       where t.ctid = any (array(select l.ctid from l))
		       returning 1)
		select (select pg_catalog.count(*) from u),
		       (select pg_catalog.count(*) from pgflow.step_tasks t
		        where t.ctid >= $1::pg_catalog.tid and t.ctid < $2::pg_catalog.tid and t.queue_name is null)`,
		tid(blk), tid(blk+n)).Scan(&b.updated, &b.nulls); err != nil {
		return nil, fmt.Errorf("online backfill: filling blocks %d to %d of pgflow.step_tasks: %w", blk, blk+n-1, err)
	}
	ok = true
	return b, nil
}

// saveProgress records the batch in its own transaction and commits both.
func (e *engine) saveProgress(ctx context.Context, b *batchResult, next int64, rate float64) error {
	defer b.tx.Rollback(context.WithoutCancel(ctx))
	_, err := b.tx.Exec(ctx, `update pgflow_upgrade.online_progress
		set next_block = $1, rows_done = rows_done + $2, batches = batches + 1, rate = $3, updated_at = pg_catalog.now()
		where id`, next, b.updated, rate)
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
