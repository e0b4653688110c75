package session

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// readOnlyIdleTimeout is the idle_in_transaction_session_timeout of
// BeginReadOnly: its callers never idle in the transaction; this only
// bounds a client that hangs between statements.
const readOnlyIdleTimeout = 30 * time.Second

// BeginReadOnly opens a read-only transaction on conn, as the audit's
// checks, status, verify, the forecast's statistics and the route report
// read: READ ONLY, REPEATABLE READ (one snapshot for everything read in
// it), with statement_timeout, lock_timeout,
// idle_in_transaction_session_timeout and application_name set LOCAL, so
// they hold through a transaction-mode pooler and vanish with the
// transaction.
func BeginReadOnly(ctx context.Context, conn *pgx.Conn, statementTimeout, lockTimeout time.Duration, appName string) (pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("beginning a read-only transaction: %w", err)
	}
	// Each limit is set, one under 1ms (zero included) as 1ms.
	err = Limits{Statement: max(statementTimeout, time.Millisecond), Lock: max(lockTimeout, time.Millisecond),
		IdleInTransaction: readOnlyIdleTimeout, ApplicationName: appName}.Set(ctx, tx)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("setting the read-only transaction's timeouts: %w", err)
	}
	return tx, nil
}
