package upgrade

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgretry"
)

// AdvisoryLockKey is the key of the transaction-level advisory lock that
// makes `apply` exclusive: the bytes of "pgflwupg". A transaction-level lock
// (pg_try_advisory_xact_lock) is released by commit or rollback on the same
// server connection, so it works through a transaction-mode pooler
// (pgbouncer, Supavisor) where a session-level lock could outlive the run on
// a pooled connection or be released on another one.
const AdvisoryLockKey int64 = 0x7067666c77757067

// ErrUpgradeLocked is returned when another apply holds the advisory lock
// for longer than Options.Wait.
var ErrUpgradeLocked = errors.New("another pgflow-upgrade apply is running on this database")

// TableLock is one explicit lock apply takes, in the documented order.
type TableLock struct {
	Table string // in schema pgflow
	Mode  string // LOCK TABLE mode
}

// LockPlan is the fixed lock order of docs/design.md ("Lock order"), with
// the modes the migration file takes itself: the tables it alters (flows,
// steps, step_tasks) need ACCESS EXCLUSIVE anyway; the others only need writers
// stopped (EXCLUSIVE), so plain reads keep going. Taking exactly the file's
// modes first makes the file's own LOCK statements no-ops.
var LockPlan = []TableLock{
	{"flows", "access exclusive"},
	{"steps", "access exclusive"},
	{"deps", "exclusive"},
	{"runs", "exclusive"},
	{"step_states", "exclusive"},
	{"step_tasks", "access exclusive"},
	{"workers", "exclusive"},
}

// conflicts lists the pg_locks modes that conflict with a LOCK TABLE mode,
// to name the sessions in our way.
var conflicts = map[string][]string{
	"exclusive": {"RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock",
		"ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"},
	"access exclusive": {"AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock", "ShareLock",
		"ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"},
}

// Blocker is a session holding (or queued for) a conflicting lock. Query
// text is never read: it may hold secrets.
type Blocker struct {
	PID             int32  `json:"pid"`
	User            string `json:"user"`
	ApplicationName string `json:"application_name"`
	State           string `json:"state"`
	Mode            string `json:"mode"`
	Granted         bool   `json:"granted"`
	XactSeconds     int64  `json:"xact_seconds"` // how long its transaction has been open
}

func (b Blocker) String() string {
	app := b.ApplicationName
	if app == "" {
		app = "-"
	}
	g := "holds"
	if !b.Granted {
		g = "waits for"
	}
	return fmt.Sprintf("pid %d (user %s, application %s, %s, transaction open %ds) %s %s",
		b.PID, b.User, app, b.State, b.XactSeconds, g, b.Mode)
}

// TableLockError says which table could not be locked within the bounds.
type TableLockError struct {
	Table    string
	Mode     string
	Attempts int
	Timeout  time.Duration
	Blockers []Blocker
	Err      error // the last lock_not_available error (*pgconn.PgError)
}

func (e *TableLockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "could not lock pgflow.%s in %s mode: %d attempts, each waiting at most %s (lock_timeout); nothing was changed",
		e.Table, strings.ToUpper(e.Mode), e.Attempts, e.Timeout)
	if len(e.Blockers) == 0 {
		b.WriteString("; the blocking session had finished when we looked")
	} else {
		b.WriteString("; in the way:")
		for _, bl := range e.Blockers {
			b.WriteString("\n  " + bl.String())
		}
	}
	return b.String()
}

func (e *TableLockError) Unwrap() error { return e.Err }

// acquireAdvisoryLock polls pg_try_advisory_xact_lock with backoff until it
// is held or wait has passed (pgretry.Poll: out of the lock queue, so
// nothing waits on us while we wait).
func acquireAdvisoryLock(ctx context.Context, tx pgx.Tx, wait time.Duration) error {
	err := pgretry.Poll(ctx, wait, func(ctx context.Context) (bool, error) {
		var ok bool
		if err := tx.QueryRow(ctx, `select pg_catalog.pg_try_advisory_xact_lock($1)`, AdvisoryLockKey).Scan(&ok); err != nil {
			return false, fmt.Errorf("taking the upgrade advisory lock: %w", err)
		}
		return ok, nil
	})
	if errors.Is(err, pgretry.ErrNotAcquired) {
		return fmt.Errorf("%w%s; waited %s (--wait), giving up without changing anything", ErrUpgradeLocked, advisoryHolder(ctx, tx), wait)
	}
	return err
}

// advisoryHolder describes who holds the advisory lock, best effort.
func advisoryHolder(ctx context.Context, tx pgx.Tx) string {
	var pid int32
	var app string
	// pg_locks shows a bigint advisory key as classid (high 32 bits) and
	// objid (low 32 bits), objsubid 1.
	key := uint64(AdvisoryLockKey)
	err := tx.QueryRow(ctx, `
		select l.pid, coalesce(a.application_name, '')
		  from pg_catalog.pg_locks l
		  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
		 where l.locktype = 'advisory' and l.granted
		   and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = pg_catalog.current_database())
		   and l.classid = $1::oid and l.objid = $2::oid and l.objsubid = 1
		 limit 1`, uint32(key>>32), uint32(key)).Scan(&pid, &app)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" (pid %d, application %q)", pid, app)
}

// lockResult is what lockTables measured.
type lockResult struct {
	Attempts int
	// Held is when the successful attempt issued its first LOCK: the start
	// of the lock window.
	Held time.Time
	// Waited is the time spent in lock attempts that failed.
	Waited time.Duration
}

// lockTables takes LockPlan in order under the transaction's lock_timeout.
// A lock_not_available (or deadlock_detected) error rolls back to a savepoint taken before the
// first LOCK, which releases every table this attempt had locked, so the
// application is blocked at most one lock_timeout per attempt; then it backs
// off with jitter and tries again, retries times at most.
//
// Deadlocks: the application takes these tables in both orders (start_flow
// flows then runs, complete_task runs then flows through a foreign-key
// check), so no fixed order avoids a cycle with it. Once the first table is
// held, the remaining locks share a budget below the server's
// deadlock_timeout: apply gives up and releases everything before an
// application session that waits on us reaches its deadlock check, so the
// application never sees 40P01; apply retries instead.
func lockTables(ctx context.Context, tx pgx.Tx, timeout time.Duration, retries int, onRetry func(attempt int, table string, wait time.Duration)) (lockResult, error) {
	var res lockResult
	var deadlockMS float64
	if err := tx.QueryRow(ctx, `select extract(epoch from pg_catalog.current_setting('deadlock_timeout')::interval) * 1000`).Scan(&deadlockMS); err != nil {
		return res, fmt.Errorf("reading deadlock_timeout: %w", err)
	}
	rest := min(timeout, time.Duration(deadlockMS/2)*time.Millisecond)
	policy := pgretry.Policy{Retries: retries, Backoff: pgretry.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	var failed *TableLock
	err := pgretry.Retry(ctx, policy, pgretry.LockError,
		func(attempt int, _ error, wait time.Duration) {
			if onRetry != nil {
				onRetry(attempt, failed.Table, wait)
			}
		},
		func(attempt int) error {
			res.Attempts = attempt
			start, l, err := lockAttempt(ctx, tx, rest, timeout)
			if err != nil && pgretry.LockError(err) {
				failed = l
				res.Waited += time.Since(start)
				if _, rbErr := tx.Exec(ctx, `rollback to savepoint pgflow_upgrade_locks`); rbErr != nil {
					return fmt.Errorf("rolling back to the savepoint after lock_timeout on pgflow.%s: %w", l.Table, rbErr)
				}
				return err
			}
			if err == nil {
				res.Held = start
			}
			return err
		})
	var ex *pgretry.ExhaustedError
	if errors.As(err, &ex) {
		return res, &TableLockError{Table: failed.Table, Mode: failed.Mode, Attempts: ex.Attempts, Timeout: timeout,
			Blockers: blockers(ctx, tx, failed.Table, failed.Mode), Err: ex.Err}
	}
	return res, err
}

// lockAttempt is one try at LockPlan under a savepoint. The first lock waits
// up to timeout; the others share a budget of rest from the first grant.
// On a lock error it returns the table it failed on (the caller rolls back
// to the savepoint, which releases every lock this attempt took).
func lockAttempt(ctx context.Context, tx pgx.Tx, rest, timeout time.Duration) (time.Time, *TableLock, error) {
	start := time.Now()
	if _, err := tx.Exec(ctx, `savepoint pgflow_upgrade_locks`); err != nil {
		return start, nil, fmt.Errorf("savepoint before table locks: %w", err)
	}
	var firstHeld time.Time
	for i := range LockPlan {
		l := &LockPlan[i]
		if i > 0 {
			left := rest - time.Since(firstHeld)
			if _, err := tx.Exec(ctx, `select pg_catalog.set_config('lock_timeout', $1, true)`, pgretry.Millis(left)); err != nil {
				return start, nil, fmt.Errorf("setting the lock budget: %w", err)
			}
		}
		// Identifiers and modes are constants of LockPlan.
		if _, err := tx.Exec(ctx, `lock table pgflow.`+l.Table+` in `+l.Mode+` mode`); err != nil {
			if pgretry.LockError(err) {
				return start, l, err
			}
			return start, nil, fmt.Errorf("lock table pgflow.%s in %s mode: %w", l.Table, l.Mode, err)
		}
		if i == 0 {
			firstHeld = time.Now()
		}
	}
	// The statements after the locks get the full lock_timeout back.
	if _, err := tx.Exec(ctx, `select pg_catalog.set_config('lock_timeout', $1, true)`, pgretry.Millis(timeout)); err != nil {
		return start, nil, fmt.Errorf("restoring lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, `release savepoint pgflow_upgrade_locks`); err != nil {
		return start, nil, fmt.Errorf("release savepoint after table locks: %w", err)
	}
	return start, nil, nil
}

// blockers lists the other sessions with a lock on pgflow.<table> that
// conflicts with mode, best effort (an error gives an empty list).
func blockers(ctx context.Context, tx pgx.Tx, table, mode string) []Blocker {
	rows, err := tx.Query(ctx, `
		select l.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(a.state, ''),
		       l.mode, l.granted, coalesce(extract(epoch from pg_catalog.now() - a.xact_start)::bigint, 0)
		  from pg_catalog.pg_locks l
		  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
		 where l.locktype = 'relation'
		   and l.relation = pg_catalog.to_regclass('pgflow.' || $1)
		   and l.pid <> pg_catalog.pg_backend_pid()
		   and l.mode = any($2)
		 order by l.granted desc, l.pid`, table, conflicts[mode])
	if err != nil {
		return nil
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Blocker, error) {
		var b Blocker
		err := r.Scan(&b.PID, &b.User, &b.ApplicationName, &b.State, &b.Mode, &b.Granted, &b.XactSeconds)
		return b, err
	})
	if err != nil {
		return nil
	}
	return out
}
