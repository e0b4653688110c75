package online

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// RollbackOptions of Rollback.
type RollbackOptions struct {
	LockTimeout time.Duration
	LockRetries int
	Wait        time.Duration
	Progress    func(Event)
}

// RollbackReport says what Rollback did.
type RollbackReport struct {
	Outcome    string       `json:"outcome"` // rolled_back | nothing_to_do | refused | lock_busy | failed
	Message    string       `json:"message"`
	PhaseFound Phase        `json:"phase_found"`
	Locks      []LockWindow `json:"locks"`
}

// ErrAlreadySwitched: Rollback refuses once the switch committed.
var ErrAlreadySwitched = errors.New("the upgrade is complete (pgflow.flows.queue_mode exists: the switch to 0.17.0 committed): rollback-online only undoes an unfinished online upgrade")

// Rollback returns a database with an unfinished online upgrade to the
// exact 0.16.0 catalog: the unique indexes (concurrently), then in one short
// transaction under lock_timeout the triggers, the checks, the columns (a
// catalog change; the values stay invisible in the rows until they are
// rewritten), pgflow.is_valid_queue_name and the online bookkeeping (and
// schema pgflow_upgrade when nothing else, e.g. the ledger, is in it).
func Rollback(ctx context.Context, conn *pgx.Conn, ro RollbackOptions) (*RollbackReport, error) {
	o := Options{LockTimeout: ro.LockTimeout, LockRetries: ro.LockRetries, Wait: ro.Wait, Progress: ro.Progress}.withDefaults()
	e := &engine{conn: conn, opts: o, rep: &Report{}, pid: conn.PgConn().PID()}
	rr := &RollbackReport{}
	release, err := sessionLock(ctx, conn, o.Wait)
	if err != nil {
		rr.Outcome, rr.Message = "lock_busy", err.Error()
		return rr, err
	}
	defer release()
	s, err := Detect(ctx, conn)
	if err != nil {
		rr.Outcome, rr.Message = "failed", err.Error()
		return rr, err
	}
	rr.PhaseFound = s.Phase()
	if s.Upgraded {
		rr.Outcome, rr.Message = "refused", ErrAlreadySwitched.Error()
		return rr, ErrAlreadySwitched
	}
	if !s.Started() {
		rr.Outcome, rr.Message = "nothing_to_do", "no online upgrade in progress: nothing to roll back"
		return rr, nil
	}
	err = func() error {
		if len(s.Indexes) > 0 {
			if _, err := conn.Exec(ctx, `set lock_timeout = 0`); err != nil {
				return fmt.Errorf("rollback-online: %w", err)
			}
		}
		for _, ix := range Indexes {
			if !s.HasIndex(ix.Name) {
				continue
			}
			if _, err := conn.Exec(ctx, `drop index concurrently if exists pgflow.`+ix.Name); err != nil {
				return fmt.Errorf("rollback-online: dropping pgflow.%s concurrently: %w", ix.Name, err)
			}
		}
		return e.ddlTx(ctx, "rollback", func(tx pgx.Tx) error {
			st, err := audit.DetectSchema(ctx, tx)
			if err != nil {
				return err
			}
			if !baselineOrOnline(st) {
				return fmt.Errorf("%w: state %s (%v): not 0.16.0 with an online upgrade; nothing was changed", ErrRefused, st.State, st.Differences)
			}
			var stmts []string
			for _, t := range upgrade.Tables { // the documented lock order
				if t == "flows" || contains(Tables, t) {
					stmts = append(stmts, `lock table pgflow.`+t+` in access exclusive mode`)
				}
			}
			for _, ix := range Indexes {
				stmts = append(stmts, `drop index if exists pgflow.`+ix.Name)
			}
			for _, t := range Tables {
				stmts = append(stmts,
					`drop trigger if exists `+TriggerName+` on pgflow.`+t,
					`alter table pgflow.`+t+` drop constraint if exists `+OnlineCheck+`, drop constraint if exists `+ValidCheck,
					`alter table pgflow.`+t+` drop column if exists queue_name`)
			}
			stmts = append(stmts, `drop function if exists pgflow.is_valid_queue_name(text)`, dropBookkeeping)
			for _, stmt := range stmts {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("rollback-online: %s: %w", summary(stmt), err)
				}
			}
			// The schema goes too when it holds nothing else (no ledger).
			if _, err := tx.Exec(ctx, `do $$ begin
				if not exists (select 1 from pg_catalog.pg_class c where c.relnamespace = pg_catalog.to_regnamespace('pgflow_upgrade'))
				   and not exists (select 1 from pg_catalog.pg_proc p where p.pronamespace = pg_catalog.to_regnamespace('pgflow_upgrade'))
				   and not exists (select 1 from pg_catalog.pg_type y where y.typnamespace = pg_catalog.to_regnamespace('pgflow_upgrade')) then
				  drop schema if exists pgflow_upgrade;
				end if;
			end $$`); err != nil {
				return fmt.Errorf("rollback-online: dropping the empty schema pgflow_upgrade: %w", err)
			}
			return nil
		})
	}()
	rr.Locks = e.rep.Locks
	if err != nil {
		rr.Outcome, rr.Message = "failed", err.Error()
		if e.rep.Outcome == upgrade.OutcomeLockBusy {
			rr.Outcome = "lock_busy"
		}
		if errors.Is(err, ErrRefused) {
			rr.Outcome = "refused"
		}
		return rr, err
	}
	rr.Outcome, rr.Message = "rolled_back", "the online upgrade was undone: the database is the pgflow 0.16.0 baseline again"
	return rr, nil
}

// summary is a statement on one line, for error messages.
func summary(stmt string) string {
	return strings.Join(strings.Fields(stmt), " ")
}
