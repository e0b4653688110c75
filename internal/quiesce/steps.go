package quiesce

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// inTx runs fn in one transaction on conn, committed when fn succeeds.
func inTx(ctx context.Context, conn *pgx.Conn, what string, fn func(tx pgx.Tx) error) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: beginning a transaction: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	// Bounded: the application's own row locks on worker_functions or cron.job
	// must not stall the quiesce indefinitely.
	if err := (session.Limits{Lock: 5 * time.Second}).Set(ctx, tx); err != nil {
		return fmt.Errorf("%s: setting lock_timeout: %w", what, err)
	}
	if err := fn(tx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: committing: %w", what, err)
	}
	return nil
}

// Pause records every worker_functions.enabled value and pgflow cron job
// active flag, then disables the functions and pauses the jobs, in one
// transaction (phase "paused").
func Pause(ctx context.Context, conn *pgx.Conn, mode string) ([]Item, error) {
	var items []Item
	err := inTx(ctx, conn, "pausing pgflow's worker functions and cron jobs", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("creating %s: %w", StateTable, err)
		}
		_, err := tx.Exec(ctx, `insert into pgflow_upgrade.quiesce (phase, mode) values ('paused', $1)`, mode)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return fmt.Errorf("%w: run `pgflow-upgrade status`", ErrInProgress)
		}
		if err != nil {
			return fmt.Errorf("recording the quiesce in %s: %w", StateTable, err)
		}
		if err := pauseNewcomers(ctx, tx); err != nil {
			return err
		}
		s, err := Load(ctx, tx)
		if err != nil {
			return err
		}
		items = s.Items
		return nil
	})
	return items, err
}

// pauseNewcomers records and disables what is not recorded yet (all of it
// on the first call; functions registered or jobs scheduled since, later),
// and disables again a recorded function someone re-enabled.
func pauseNewcomers(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `
		insert into pgflow_upgrade.quiesce_items (kind, name, recorded)
		select 'function', f.function_name, f.enabled from pgflow.worker_functions f
		on conflict (kind, name) do nothing`); err != nil {
		return fmt.Errorf("recording pgflow.worker_functions.enabled: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		update pgflow.worker_functions f set enabled = false
		 where f.enabled
		   and exists (select 1 from pgflow_upgrade.quiesce_items i where i.kind = 'function' and i.name = f.function_name)`); err != nil {
		return fmt.Errorf("disabling pgflow.worker_functions: %w", err)
	}
	cron, alter, err := cronAPI(ctx, tx)
	if err != nil || !cron {
		return err // no pg_cron: nothing to pause
	}
	all, err := cronJobs(ctx, tx)
	if err != nil {
		return err
	}
	jobs, _ := splitByDatabase(all)
	for _, j := range jobs {
		if _, err := tx.Exec(ctx, `insert into pgflow_upgrade.quiesce_items (kind, name, label, recorded)
			values ('cron_job', $1, nullif($2, ''), $3) on conflict (kind, name) do nothing`, strconv.FormatInt(j.JobID, 10), j.Name, j.Active); err != nil {
			return fmt.Errorf("recording cron job %d (%s): %w", j.JobID, j.Name, err)
		}
		if !j.Active {
			continue
		}
		if !alter {
			return fmt.Errorf("%w: cron job %d (%s) is active and pg_cron has no cron.alter_job (older than 1.4?); pause it yourself or upgrade pg_cron", ErrCronAPI, j.JobID, j.Name)
		}
		if _, err := tx.Exec(ctx, `select cron.alter_job(job_id => $1::bigint, active => false)`, j.JobID); err != nil {
			return fmt.Errorf("pausing cron job %d (%s) with cron.alter_job: %w", j.JobID, j.Name, err)
		}
	}
	return nil
}

// deprecateLive sets deprecated_at on the live workers not deprecated yet.
func deprecateLive(ctx context.Context, tx pgx.Tx, live time.Duration) (int, error) {
	tag, err := tx.Exec(ctx, `
		update pgflow.workers w set deprecated_at = pg_catalog.now()
		 where w.stopped_at is null and w.deprecated_at is null
		   and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $1)`, live.Seconds())
	if err != nil {
		return 0, fmt.Errorf("deprecating the live workers in pgflow.workers: %w", err)
	}
	n := int(tag.RowsAffected())
	if n > 0 {
		if _, err := tx.Exec(ctx, `update pgflow_upgrade.quiesce set workers_deprecated = workers_deprecated + $1, updated_at = pg_catalog.now()`, n); err != nil {
			return 0, fmt.Errorf("counting deprecated workers in %s: %w", StateTable, err)
		}
	}
	return n, nil
}

// Deprecate deprecates every live 0.16.0 worker (phase "deprecated"): each
// stops polling at its next heartbeat. Deprecation is not undone: the
// workers exit, and restoring enabled lets ensure_workers start new ones.
func Deprecate(ctx context.Context, conn *pgx.Conn, live time.Duration) (int, error) {
	var n int
	err := inTx(ctx, conn, "deprecating the live 0.16.0 workers", func(tx pgx.Tx) error {
		var err error
		if n, err = deprecateLive(ctx, tx, live); err != nil {
			return err
		}
		return setPhase(ctx, tx, PhaseDeprecated)
	})
	return n, err
}

// Left counts what the drain waits for: tasks started by live workers, and
// live workers that have not seen their deprecation yet.
func Left(ctx context.Context, q Querier, live time.Duration) (tasks, workers int64, err error) {
	err = q.QueryRow(ctx, `
		with live as (
		  select w.worker_id, w.deprecated_at, w.last_heartbeat_at from pgflow.workers w
		   where w.stopped_at is null and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $1)
		)
		select (select pg_catalog.count(*) from pgflow.step_tasks t
		         where t.status = 'started' and t.last_worker_id in (select live.worker_id from live)),
		       (select pg_catalog.count(*) from live
		         where live.deprecated_at is null or live.last_heartbeat_at < live.deprecated_at)`, live.Seconds()).Scan(&tasks, &workers)
	if err != nil {
		return 0, 0, fmt.Errorf("counting started tasks and live workers: %w", err)
	}
	return tasks, workers, nil
}

// WaitDrained polls until no task is started by a live worker and every
// live worker has seen its deprecation (phase "drained"), bounded by
// opts.DrainTimeout. Each poll also pauses and deprecates what appeared
// since (a function registered, a worker started). It returns the workers
// it deprecated.
func WaitDrained(ctx context.Context, conn *pgx.Conn, opts Options) (int, error) {
	opts = opts.withDefaults()
	deadline := time.Now().Add(opts.DrainTimeout)
	total := 0
	for {
		var tasks, workers int64
		err := inTx(ctx, conn, "waiting for the workers to drain", func(tx pgx.Tx) error {
			if err := pauseNewcomers(ctx, tx); err != nil {
				return err
			}
			n, err := deprecateLive(ctx, tx, opts.LiveWorker)
			if err != nil {
				return err
			}
			total += n
			if tasks, workers, err = Left(ctx, tx, opts.LiveWorker); err != nil {
				return err
			}
			if tasks == 0 && workers == 0 {
				return setPhase(ctx, tx, PhaseDrained)
			}
			return nil
		})
		if err != nil {
			return total, err
		}
		opts.progress(Event{Step: "drain", Detail: fmt.Sprintf("%d task(s) started by live workers, %d worker(s) still polling", tasks, workers), TasksLeft: tasks, WorkersLeft: workers})
		if tasks == 0 && workers == 0 {
			return total, nil
		}
		if time.Now().After(deadline) {
			return total, fmt.Errorf("%w (%s): %d task(s) still started by live workers, %d worker(s) still polling; everything is restored, nothing upgraded: raise --drain-timeout, or stop those workers and rerun",
				ErrDrainTimeout, opts.DrainTimeout, tasks, workers)
		}
		select {
		case <-ctx.Done():
			return total, fmt.Errorf("waiting for the workers to drain: %w", ctx.Err())
		case <-time.After(opts.Poll):
		}
	}
}

// Restore sets every recorded cron job flag (first) and worker function
// enabled value (after) back, exactly, and deletes the recorded state, in
// one transaction. Recorded items that are gone are returned as missing.
// Without a recorded quiesce it does nothing.
func Restore(ctx context.Context, conn *pgx.Conn) (missing []string, err error) {
	err = inTx(ctx, conn, "restoring the recorded worker functions and cron jobs", func(tx pgx.Tx) error {
		missing = nil
		s, err := Load(ctx, tx)
		if err != nil || s == nil {
			return err
		}
		// Lock the state row: a second restore waits, then finds nothing.
		if _, err := tx.Exec(ctx, `select 1 from pgflow_upgrade.quiesce for update`); err != nil {
			return fmt.Errorf("locking %s: %w", StateTable, err)
		}
		cron, alter, err := cronAPI(ctx, tx)
		if err != nil {
			return err
		}
		for _, it := range s.Items {
			if it.Kind != KindCronJob {
				continue
			}
			if !cron {
				missing = append(missing, "cron job "+it.Name+" "+it.Label+" (pg_cron is gone)")
				continue
			}
			var jobID int64
			var active bool
			err := tx.QueryRow(ctx, `select j.jobid, j.active from cron.job j
				 where j.jobid = $1::bigint or (j.jobname = $2 and not exists (select 1 from cron.job k where k.jobid = $1::bigint))
				 order by j.jobid = $1::bigint desc limit 1`, it.Name, it.Label).Scan(&jobID, &active)
			if errors.Is(err, pgx.ErrNoRows) {
				missing = append(missing, "cron job "+it.Name+" "+it.Label)
				continue
			}
			if err != nil {
				return fmt.Errorf("reading cron job %s (%s): %w", it.Name, it.Label, err)
			}
			if active == it.Recorded {
				continue
			}
			if !alter {
				return fmt.Errorf("%w: pg_cron has no cron.alter_job to set cron job %d back to active = %v", ErrCronAPI, jobID, it.Recorded)
			}
			if _, err := tx.Exec(ctx, `select cron.alter_job(job_id => $1::bigint, active => $2::boolean)`, jobID, it.Recorded); err != nil {
				return fmt.Errorf("setting cron job %d (%s) back to active = %v: %w", jobID, it.Label, it.Recorded, err)
			}
		}
		rows, err := tx.Query(ctx, `
			select i.name from pgflow_upgrade.quiesce_items i
			 where i.kind = 'function'
			   and not exists (select 1 from pgflow.worker_functions f where f.function_name = i.name)
			 order by i.name`)
		if err != nil {
			return fmt.Errorf("looking for recorded worker functions that are gone: %w", err)
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("looking for recorded worker functions that are gone: %w", err)
		}
		for _, g := range gone {
			missing = append(missing, "worker function "+g)
		}
		if _, err := tx.Exec(ctx, `
			update pgflow.worker_functions f set enabled = i.recorded
			  from pgflow_upgrade.quiesce_items i
			 where i.kind = 'function' and i.name = f.function_name and f.enabled is distinct from i.recorded`); err != nil {
			return fmt.Errorf("restoring pgflow.worker_functions.enabled: %w", err)
		}
		if _, err := tx.Exec(ctx, `delete from pgflow_upgrade.quiesce_items; delete from pgflow_upgrade.quiesce`); err != nil {
			return fmt.Errorf("deleting the recorded quiesce: %w", err)
		}
		return nil
	})
	return missing, err
}
