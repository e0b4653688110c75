package online

import (
	"context"
	"errors"
	"fmt"
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
var ErrAlreadySwitched = errors.New("the upgrade is complete (pgflow.schema_revisions exists): rollback-online only undoes an unfinished online upgrade")

// Rollback returns a database with an unfinished online upgrade to the
// exact 0.16.0 baseline: the index (concurrently), then in one short
// transaction under lock_timeout the trigger, the check, the column (a
// catalog change; the values stay invisible in the rows until they are
// rewritten) and schema pgflow_upgrade.
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
		if s.Index {
			if _, err := conn.Exec(ctx, `set lock_timeout = 0`); err != nil {
				return fmt.Errorf("rollback-online: %w", err)
			}
			if _, err := conn.Exec(ctx, `drop index concurrently if exists pgflow.`+IndexName); err != nil {
				return fmt.Errorf("rollback-online: dropping pgflow.%s concurrently: %w", IndexName, err)
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
			for _, stmt := range []string{
				`lock table pgflow.step_tasks in access exclusive mode`,
				`drop trigger if exists ` + TriggerName + ` on pgflow.step_tasks`,
				`alter table pgflow.step_tasks drop constraint if exists ` + CheckName,
				`drop index if exists pgflow.` + IndexName,
				`alter table pgflow.step_tasks drop column if exists queue_name`,
				dropOwnObjects,
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("rollback-online: %s: %w", stmt, err)
				}
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
