package upgrade

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
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
	tx, err := audit.BeginReadOnly(ctx, conn, readStatementTimeout, readLockTimeout, "pgflow-upgrade verify")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	out, err := RunChecks(ctx, tx, true)
	if err != nil {
		return nil, fmt.Errorf("verifying the upgraded schema: %w", err)
	}
	return &VerifyReport{OK: len(Failed(out)) == 0, Checks: out}, nil
}
