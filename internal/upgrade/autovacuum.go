package upgrade

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Autovacuum on a pgflow table is in the way of every ACCESS EXCLUSIVE or
// EXCLUSIVE lock the upgrade takes: a worker vacuuming step_tasks holds
// SHARE UPDATE EXCLUSIVE on it, often for minutes on a large table (and
// step_tasks is due a vacuum right after a rewrite or a backfill).
// PostgreSQL cancels such a worker itself, but only for a waiter that has
// waited a whole deadlock_timeout (1 s by default), and the upgrade's lock
// attempts never wait that long: each is bounded by lock_timeout, and the
// ones after the first by half of deadlock_timeout, so that an application
// session queued behind them never reaches its own deadlock check. Left
// alone, every attempt waits its bound with the application queued behind
// it, and the upgrade gives up. So both the transactional apply and the
// online path cancel such a worker just before each lock attempt, as
// PostgreSQL would: a cancelled autovacuum starts again later, nothing is
// lost. A worker that vacuums to prevent wraparound is left alone, as
// PostgreSQL leaves it.

// Beginner opens a transaction: a *pgx.Conn (a transaction of its own), or
// a pgx.Tx (a savepoint inside it, so that a refusal to cancel does not
// abort the caller's transaction).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

var _ Beginner = (*pgx.Conn)(nil)
var _ Beginner = (pgx.Tx)(nil)

// autovacuumSQL cancels every autovacuum worker of the current database
// that holds a lock on a table of schema pgflow (or on its indexes), except
// those preventing wraparound, and counts them. pg_locks lists locks of all
// databases: a relation oid only means something with its database.
const autovacuumSQL = `
	select pg_catalog.count(*) filter (where pg_catalog.pg_cancel_backend(a.pid))::pg_catalog.int4
	  from pg_catalog.pg_stat_activity a
	 where a.backend_type operator(pg_catalog.=) 'autovacuum worker'
	   and a.datname operator(pg_catalog.=) pg_catalog.current_database()
	   and a.query operator(pg_catalog.!~~) '%to prevent wraparound%'
	   and exists (select 1
	                 from pg_catalog.pg_locks l
	                 join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) l.relation
	                where l.pid operator(pg_catalog.=) a.pid and l.granted
	                  and l.locktype operator(pg_catalog.=) 'relation'
	                  and l.database operator(pg_catalog.=) (select d.oid from pg_catalog.pg_database d
	                                                          where d.datname operator(pg_catalog.=) pg_catalog.current_database())
	                  and c.relnamespace operator(pg_catalog.=) pg_catalog.to_regnamespace('pgflow'))`

// CancelAutovacuum cancels the autovacuum workers that hold a lock on a
// pgflow table (not those preventing wraparound) and says how many it
// cancelled. The cancel is a signal: the worker lets go of its locks within
// moments, by the time a LOCK sent next has queued.
//
// An error means nothing was cancelled, typically because the role may not
// signal an autovacuum worker (PostgreSQL 15 to 17: only a superuser may;
// 18: also members of pg_signal_autovacuum_worker); with a pgx.Tx it leaves
// the caller's transaction usable (the attempt ran under a savepoint).
func CancelAutovacuum(ctx context.Context, db Beginner) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("cancelling autovacuum on pgflow tables: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// Inside a transaction pg_stat_activity keeps the rows of its first
	// read: a worker that started since would be missed, and the pid of
	// one that ended could name another process by now.
	if _, err := tx.Exec(ctx, `select pg_catalog.pg_stat_clear_snapshot()`); err != nil {
		return 0, fmt.Errorf("cancelling autovacuum on pgflow tables: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, autovacuumSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("cancelling autovacuum on pgflow tables: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("cancelling autovacuum on pgflow tables: %w", err)
	}
	return n, nil
}

// AutovacuumNote says that an autovacuum could not be cancelled, and why.
func AutovacuumNote(err error) string {
	why := err.Error()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		why = pgErr.Code + " " + pgErr.Message
	}
	return fmt.Sprintf("could not cancel the autovacuum on pgflow tables (%s): only a superuser may cancel an autovacuum worker "+
		"(PostgreSQL 18: also members of pg_signal_autovacuum_worker)", why)
}
