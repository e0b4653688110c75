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
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// backfillSteps fills pgflow.steps.queue_name: a small table (flow
// definitions), so one statement, but one that skips rows an application
// transaction holds and comes back for them, never waiting for a row lock.
func (e *engine) backfillSteps(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		var filled, left int64
		err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
			if err := (session.Limits{Lock: e.opts.LockTimeout, Statement: 60 * time.Second}).Set(ctx, tx); err != nil {
				return fmt.Errorf("online backfill steps: settings: %w", err)
			}
			return tx.QueryRow(ctx, `
				with l as materialized (
				       select s.flow_slug, s.step_slug from pgflow.steps s where s.queue_name is null
				       for update of s skip locked),
				     u as (
				       update pgflow.steps s set queue_name = pg_catalog.lower(s.flow_slug)
				       from l where s.flow_slug = l.flow_slug and s.step_slug = l.step_slug
				       returning 1)
				select (select pg_catalog.count(*) from u),
				       (select pg_catalog.count(*) from pgflow.steps s where s.queue_name is null) - (select pg_catalog.count(*) from u)`).Scan(&filled, &left)
		})
		if err != nil && !pgretry.LockError(err) {
			return fmt.Errorf("online backfill: filling pgflow.steps.queue_name: %w", err)
		}
		e.rep.Backfill.Steps += filled
		if err == nil && left <= 0 {
			return nil
		}
		if attempt >= e.opts.LockRetries {
			e.res.Outcome = outcome.LockBusy
			return fmt.Errorf("online backfill: %d pgflow.steps rows stayed locked by other transactions through %d attempts; run apply --online again", left, attempt+1)
		}
		if err := pgretry.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// contract: pgflow.is_valid_queue_name (the file's statement), the two
// checks per table NOT VALID (a short lock), VALIDATE (SHARE UPDATE
// EXCLUSIVE: reads and writes go on), then the three unique indexes
// CONCURRENTLY, outside any transaction. Each step is skipped when the
// catalog has it already; an INVALID index left by a killed CONCURRENTLY
// build is dropped (concurrently) and built again.
func (e *engine) contract(ctx context.Context) error {
	s, err := ReadShape(ctx, e.conn)
	if err != nil {
		return err
	}
	if s.CheckForeign {
		e.res.Outcome = outcome.Refused
		return fmt.Errorf("%w: pgflow.steps or pgflow.step_tasks has a constraint named %s or %s that is not the online upgrade's (%s; %s): drop it, or apply --rollback-online",
			ErrRefused, OnlineCheck, ValidCheck, onlineCheckDef, validCheckDef)
	}
	if !s.Function || s.Checks < 2*len(Tables) {
		if err := e.hook(ctx, PointCheck); err != nil {
			return err
		}
		// The checks are enforced on every write from now on. A row still
		// NULL cannot make an application write fail: the triggers fill it
		// first (INSERT, or UPDATE of an unfilled row). The backfill left none
		// (VALIDATE proves it; if it finds one, validate fills and retries).
		fn, err := functionStatement()
		if err != nil {
			return err
		}
		if err := e.ddlTx(ctx, "checks not valid", func(tx pgx.Tx) error {
			// The file's own function: the switch replaces it with the same text.
			if _, err := tx.Exec(ctx, fn); err != nil {
				return fmt.Errorf("online contract: creating pgflow.is_valid_queue_name: %w", err)
			}
			e.lockWindowStarts()
			for _, t := range Tables {
				if _, err := tx.Exec(ctx, `lock table pgflow.`+t+` in access exclusive mode`); err != nil {
					return fmt.Errorf("online contract: lock table pgflow.%s: %w", t, err)
				}
			}
			for _, t := range Tables {
				for _, c := range []struct{ name, expr string }{
					{OnlineCheck, `queue_name is not null and queue_name = pg_catalog.lower(flow_slug)`},
					{ValidCheck, `pgflow.is_valid_queue_name(queue_name)`},
				} {
					var has bool
					if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_constraint c
						where c.conrelid = $1::pg_catalog.regclass and c.conname = $2)`, "pgflow."+t, c.name).Scan(&has); err != nil {
						return fmt.Errorf("online contract: reading the constraints of pgflow.%s: %w", t, err)
					}
					if has {
						continue
					}
					if _, err := tx.Exec(ctx, `alter table pgflow.`+t+` add constraint `+c.name+` check (`+c.expr+`) not valid`); err != nil {
						return fmt.Errorf("online contract: adding %s on pgflow.%s NOT VALID: %w", c.name, t, err)
					}
				}
			}
			return setPhase(ctx, tx, PhaseContract)
		}); err != nil {
			return err
		}
	}
	if s.ChecksValid < 2*len(Tables) {
		if err := e.hook(ctx, PointValidate); err != nil {
			return err
		}
		if err := e.validate(ctx); err != nil {
			return err
		}
	}
	for _, ix := range Indexes {
		if s.IndexValid(ix.Name) {
			continue
		}
		if err := e.hook(ctx, PointIndex); err != nil {
			return err
		}
		if err := e.buildIndex(ctx, ix, s.HasIndex(ix.Name)); err != nil {
			return err
		}
	}
	return nil
}

// validate validates every check not yet validated, one table at a time,
// under SHARE UPDATE EXCLUSIVE (which no application statement conflicts
// with); waiting for it (behind autovacuum, say) blocks no one either, so
// its lock wait is generous.
func (e *engine) validate(ctx context.Context) error {
	err := e.validateAll(ctx)
	if errors.Is(err, errNullsLeft) {
		// A row without queue_name (e.g. written while a trigger was missing
		// and the pass not restarted): one more backfill pass, then again.
		if err := e.backfill(ctx); err != nil {
			return err
		}
		err = e.validateAll(ctx)
		if errors.Is(err, errNullsLeft) {
			e.res.Outcome = outcome.Refused
			return fmt.Errorf("%w: rows of pgflow.steps or pgflow.step_tasks still have no queue_name after another backfill pass; run apply --online again, or apply --rollback-online: %w", ErrRefused, err)
		}
	}
	return err
}

// errNullsLeft: VALIDATE of the online check found a row without queue_name.
var errNullsLeft = errors.New("a row without queue_name")

func (e *engine) validateAll(ctx context.Context) error {
	for _, t := range Tables {
		for _, c := range []string{OnlineCheck, ValidCheck} {
			var pending bool
			if err := e.conn.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_constraint c
				where c.conrelid = $1::pg_catalog.regclass and c.conname = $2 and not c.convalidated)`, "pgflow."+t, c).Scan(&pending); err != nil {
				return fmt.Errorf("online validate: reading pgflow.%s: %w", t, err)
			}
			if !pending {
				continue
			}
			if err := e.validateOne(ctx, t, c); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *engine) validateOne(ctx context.Context, table, check string) error {
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("online validate: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := (session.Limits{Lock: 60 * time.Second, Statement: session.NoLimit}).Set(ctx, tx); err != nil {
		return fmt.Errorf("online validate: settings: %w", err)
	}
	if _, err := tx.Exec(ctx, `alter table pgflow.`+table+` validate constraint `+check); err != nil {
		var pgErr *pgconn.PgError
		_ = tx.Rollback(ctx) // the session is free for the look below
		if errors.As(err, &pgErr) && pgErr.Code == "23514" && check == OnlineCheck {
			var nulls bool
			if qerr := e.conn.QueryRow(ctx, `select exists (select 1 from pgflow.`+table+` t where t.queue_name is null)`).Scan(&nulls); qerr == nil && nulls {
				return fmt.Errorf("online validate: %s on pgflow.%s: %w: %w", check, table, errNullsLeft, err)
			}
		}
		if errors.As(err, &pgErr) && pgErr.Code == "23514" {
			// Cannot happen after a clean backfill; if it does, the rows say
			// what is wrong: a queue_name set by hand, or a slug 0.17.0 refuses.
			e.res.Outcome = outcome.Refused
			return fmt.Errorf("%w: some pgflow.%s.queue_name is not lower(flow_slug) or not a valid queue name (over 47 characters?): `pgflow-upgrade audit` lists them; fix them, or apply --rollback-online: %w", ErrRefused, table, err)
		}
		return fmt.Errorf("online validate: validating %s on pgflow.%s: %w", check, table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("online validate: commit: %w", err)
	}
	return nil
}

// buildIndex (re)builds one unique index CONCURRENTLY, with the migration
// file's definition. A build that fails drops its invalid index and says so.
func (e *engine) buildIndex(ctx context.Context, ix Index, exists bool) error {
	stmt, err := indexStatement(ix)
	if err != nil {
		return err
	}
	// Session settings (no transaction here): no statement or lock timeout.
	// CONCURRENTLY waits for older transactions through lock waits; a
	// lock_timeout would leave an INVALID index behind instead of waiting.
	for _, set := range []string{`set statement_timeout = 0`, `set lock_timeout = 0`} {
		if _, err := e.conn.Exec(ctx, set); err != nil {
			return fmt.Errorf("online index: %s: %w", set, err)
		}
	}
	drop := `drop index concurrently if exists pgflow.` + ix.Name
	if exists {
		if _, err := e.conn.Exec(ctx, drop); err != nil {
			return fmt.Errorf("online index: dropping the invalid leftover pgflow.%s: %w", ix.Name, err)
		}
	}
	if _, err := e.conn.Exec(ctx, stmt); err != nil {
		_, dropErr := e.conn.Exec(context.WithoutCancel(ctx), drop)
		dropped := "its invalid index was dropped"
		if dropErr != nil {
			dropped = fmt.Sprintf("dropping its invalid index failed too (%v): apply --online drops it on the next run", dropErr)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return e.refuseDuplicates(ctx, ix, fmt.Errorf("%w: pgflow.%s (%s); %s: %w", ErrDuplicate, ix.Name, pgErr.Detail, dropped, err))
		}
		return fmt.Errorf("online index: create unique index concurrently pgflow.%s failed; %s: %w", ix.Name, dropped, err)
	}
	return nil
}

// refuseDuplicates answers a unique index build that met duplicates (the
// question the first preflight no longer scans for): the audit check that
// explains the index (ix.Check) runs now, its findings become the report's
// blockers exactly as a preflight refusal's would, and the online upgrade is
// rolled back, so the database is the 0.16.0 it was before the run (as
// apply --rollback-online leaves it). The outcome is refused (exit 1).
func (e *engine) refuseDuplicates(ctx context.Context, ix Index, cause error) error {
	e.res.Outcome = outcome.Refused
	summary := "see `pgflow-upgrade audit`, check " + ix.Check
	err := pgx.BeginFunc(ctx, e.conn, func(tx pgx.Tx) error {
		po := e.opts.Preflight
		po.Checks = []string{ix.Check}
		po.ApplicationName = "pgflow-upgrade apply --online"
		res, err := preflight.Run(ctx, tx, po)
		e.rep.Preflight = append(e.rep.Preflight, res.Checks...)
		if err != nil {
			return err
		}
		b := res.Blockers()
		e.rep.Blockers = append(e.rep.Blockers, b...)
		summary = res.Summary() + " (" + ix.Check + ")"
		if len(b) > 0 {
			summary += ": " + b[0].Message
		}
		return nil
	})
	if err != nil {
		summary += fmt.Sprintf(" (listing them failed: %v)", err)
	}
	rr, rerr := Rollback(ctx, e.conn, RollbackOptions{LockTimeout: e.opts.LockTimeout, LockRetries: e.opts.LockRetries, Wait: e.opts.Wait, Progress: e.opts.Progress})
	undone := "the online upgrade was rolled back: the database is the 0.16.0 it was before"
	if rerr != nil {
		undone = fmt.Sprintf("rolling the online upgrade back failed (%s: %v): run apply --rollback-online", rr.Outcome, rerr)
	}
	e.res.Message = fmt.Sprintf("%s: %s; %s", outcome.ErrPreflight, summary, undone)
	return fmt.Errorf("%w: %w: %s; %s: %w", ErrRefused, outcome.ErrPreflight, summary, undone, cause)
}
