package upgrade

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// VerifyReport is what `verify` prints.
type VerifyReport struct {
	OK     bool           `json:"ok"`
	Checks []CheckOutcome `json:"checks"`
}

// Verify runs Checks in one READ ONLY transaction with statement and lock
// timeouts: after an upgrade, the new schema is whole and the 0.16.0 worker
// protocol is fenced. OK is false when any check failed.
func Verify(ctx context.Context, conn *pgx.Conn) (*VerifyReport, error) {
	tx, err := session.BeginReadOnly(ctx, conn, readStatementTimeout, readLockTimeout, "pgflow-upgrade verify")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	out, err := RunChecks(ctx, tx, true)
	if err != nil {
		return nil, fmt.Errorf("verifying the upgraded schema: %w", err)
	}
	q, err := quiesceClosed(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("verifying the upgraded schema: %w", err)
	}
	out = append(out, q)
	return &VerifyReport{OK: len(Failed(out)) == 0, Checks: out}, nil
}

// quiesceClosed: no apply --quiesce record is left open. Not one of the
// schema's post-conditions (apply checks those inside its own quiesce): an
// apply --quiesce killed after its commit, before its restore, leaves an
// upgraded schema with every worker function disabled and pgflow's cron
// jobs paused.
func quiesceClosed(ctx context.Context, q Querier) (CheckOutcome, error) {
	o := CheckOutcome{ID: "quiesce_closed", Title: "no apply --quiesce left its record open (worker functions disabled, cron jobs paused)", OK: true}
	rec, unreadable, err := quiesce.Find(ctx, q)
	switch {
	case err != nil:
		return o, err
	case unreadable:
		o.Detail = "not checked: this role cannot read pgflow_upgrade.quiesce"
	case rec != nil:
		o.OK = false
		q := versions.NewQuiesce(rec)
		o.Detail = ErrQuiesceRecorded.Error() + " " + quiesceHeld(q) + "; " + quiesceCommands(q)
	}
	return o, nil
}
