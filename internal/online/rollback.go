package online

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// RollbackOptions of Rollback.
type RollbackOptions struct {
	LockTimeout time.Duration
	LockRetries int
	Wait        time.Duration
	Progress    func(Event)
}

// RollbackReport says what Rollback did (outcome.Result's Report). The
// outcome is rolled_back or nothing_to_do, else refused, lock_busy,
// interrupted or failed.
type RollbackReport struct {
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
// schema pgflow_upgrade when nothing else, e.g. the ledger, is in it). The
// result is never nil; its outcome and the error follow internal/upgrade's
// rule.
func Rollback(ctx context.Context, conn *pgx.Conn, ro RollbackOptions) (*outcome.Result[*RollbackReport], error) {
	e := newEngine(conn, Options{LockTimeout: ro.LockTimeout, LockRetries: ro.LockRetries, Wait: ro.Wait, Progress: ro.Progress}.withDefaults())
	res := &outcome.Result[*RollbackReport]{Report: &RollbackReport{}}
	err := e.rollback(ctx, res)
	res.Report.Locks = e.rep.Locks
	if res.Outcome == "" && e.res.Outcome == outcome.LockBusy {
		res.Outcome = outcome.LockBusy // a ddlTx that did not get its locks
	}
	return res, outcome.Settle(ctx, conn, res, err)
}

// rollback is Rollback's plan: the online lock, the state, then the undo.
func (e *engine) rollback(ctx context.Context, res *outcome.Result[*RollbackReport]) error {
	conn, o := e.conn, e.opts
	release, err := sessionLock(ctx, conn, o.Wait)
	if err != nil {
		if errors.Is(err, ErrBusy) {
			res.Outcome = outcome.LockBusy
		}
		return err
	}
	defer release()
	s, err := ReadShape(ctx, conn)
	if err != nil {
		return err
	}
	res.Report.PhaseFound = s.Phase()
	if s.Upgraded {
		res.Outcome = outcome.Refused
		return ErrAlreadySwitched
	}
	if !s.Started() {
		res.Outcome, res.Message = outcome.NothingToDo, "no online upgrade in progress: nothing to roll back"
		return nil
	}
	if err := e.undo(ctx, s); err != nil {
		if errors.Is(err, ErrRefused) {
			res.Outcome = outcome.Refused
		}
		return err
	}
	res.Outcome, res.Message = outcome.RolledBack, "the online upgrade was undone: the database is the pgflow 0.16.0 baseline again"
	return nil
}

// undo walks the plan back (type undo): every operation's part outside a
// transaction, then every operation's statements in one short transaction
// under the ordered table locks, last operation first.
func (e *engine) undo(ctx context.Context, s Shape) error {
	ops := plan()
	for i := len(ops) - 1; i >= 0; i-- {
		if out := ops[i].undo.outside; out != nil {
			if err := out(e, ctx, s); err != nil {
				return err
			}
		}
	}
	return e.ddlTx(ctx, "rollback", func(tx pgx.Tx) error {
		st, err := versions.DetectSchema(ctx, tx)
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
		for i := len(ops) - 1; i >= 0; i-- {
			if undo := ops[i].undo.statements; undo != nil {
				stmts = append(stmts, undo()...)
			}
		}
		e.lockWindowStarts() // the statements begin with the locks
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
}

// dropIndexesConcurrently is contract's undo outside the transaction: the
// unique indexes it built, each dropped concurrently (the application
// goes on), with no lock timeout (a concurrent drop waits for the
// transactions that use the index, never blocking them).
func (e *engine) dropIndexesConcurrently(ctx context.Context, s Shape) error {
	if len(s.Indexes) == 0 {
		return nil
	}
	if _, err := e.conn.Exec(ctx, `set lock_timeout = 0`); err != nil {
		return fmt.Errorf("rollback-online: %w", err)
	}
	for _, ix := range Indexes {
		if !s.HasIndex(ix.Name) {
			continue
		}
		if _, err := e.conn.Exec(ctx, `drop index concurrently if exists pgflow.`+ix.Name); err != nil {
			return fmt.Errorf("rollback-online: dropping pgflow.%s concurrently: %w", ix.Name, err)
		}
	}
	return nil
}

// undoContract: any unique index left, the checks on both tables, then
// is_valid_queue_name, which the 0.17.0 check calls.
func undoContract() []string {
	var stmts []string
	for _, ix := range Indexes {
		stmts = append(stmts, `drop index if exists pgflow.`+ix.Name)
	}
	for _, t := range Tables {
		stmts = append(stmts, `alter table pgflow.`+t+` drop constraint if exists `+OnlineCheck+`, drop constraint if exists `+ValidCheck)
	}
	return append(stmts, `drop function if exists pgflow.is_valid_queue_name(text)`)
}

// undoExpand: the fill triggers and the queue_name columns (a catalog
// change; the backfilled values stay invisible in the rows until they are
// rewritten), then the bookkeeping (the progress table and the triggers'
// function).
func undoExpand() []string {
	var stmts []string
	for _, t := range Tables {
		stmts = append(stmts, `drop trigger if exists `+TriggerName+` on pgflow.`+t, `alter table pgflow.`+t+` drop column if exists queue_name`)
	}
	return append(stmts, dropBookkeeping)
}

// summary is a statement on one line, for error messages.
func summary(stmt string) string {
	return strings.Join(strings.Fields(stmt), " ")
}
