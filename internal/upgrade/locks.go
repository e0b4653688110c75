package upgrade

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// step_tasks) need ACCESS EXCLUSIVE anyway; the others only need writers
// stopped (EXCLUSIVE), so plain reads keep going. Taking exactly the file's
// modes first makes the file's own LOCK statements no-ops.
var LockPlan = []TableLock{
	{"flows", "access exclusive"},
	{"steps", "exclusive"},
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

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// jittered returns a duration in [d/2, d): "equal jitter", so retries of
// several tools do not line up, and each still waits about d.
func jittered(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// acquireAdvisoryLock polls pg_try_advisory_xact_lock with backoff until it
// is held or wait has passed. Polling (not pg_advisory_xact_lock) keeps us
// out of the lock queue, so nothing waits on us while we wait.
func acquireAdvisoryLock(ctx context.Context, tx pgx.Tx, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	delay := 50 * time.Millisecond
	for {
		var ok bool
		if err := tx.QueryRow(ctx, `select pg_catalog.pg_try_advisory_xact_lock($1)`, AdvisoryLockKey).Scan(&ok); err != nil {
			return fmt.Errorf("taking the upgrade advisory lock: %w", err)
		}
		if ok {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			holder := advisoryHolder(ctx, tx)
			return fmt.Errorf("%w%s; waited %s (--wait), giving up without changing anything", ErrUpgradeLocked, holder, wait)
		}
		if err := sleep(ctx, min(jittered(delay), left)); err != nil {
			return err
		}
		delay = min(delay*2, time.Second)
	}
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
	delay := 200 * time.Millisecond
	var deadlockMS float64
	if err := tx.QueryRow(ctx, `select extract(epoch from pg_catalog.current_setting('deadlock_timeout')::interval) * 1000`).Scan(&deadlockMS); err != nil {
		return res, fmt.Errorf("reading deadlock_timeout: %w", err)
	}
	rest := min(timeout, time.Duration(deadlockMS/2)*time.Millisecond)
	for attempt := 1; ; attempt++ {
		res.Attempts = attempt
		if _, err := tx.Exec(ctx, `savepoint pgflow_upgrade_locks`); err != nil {
			return res, fmt.Errorf("savepoint before table locks: %w", err)
		}
		start := time.Now()
		failed, lockErr := "", error(nil)
		mode := ""
		var firstHeld time.Time
		for i, l := range LockPlan {
			if i > 0 {
				left := rest - time.Since(firstHeld)
				if _, err := tx.Exec(ctx, fmt.Sprintf(`set local lock_timeout = %d`, max(left.Milliseconds(), 1))); err != nil {
					return res, fmt.Errorf("setting the lock budget: %w", err)
				}
			}
			// Identifiers and modes are constants of LockPlan.
			if _, err := tx.Exec(ctx, `lock table pgflow.`+l.Table+` in `+l.Mode+` mode`); err != nil {
				var pgErr *pgconn.PgError
				// 55P03: lock_timeout. 40P01: an application transaction
				// that holds a later table and now wants one we hold (e.g.
				// complete_task holds runs, then its step_tasks insert
				// checks the flows FK); we waited first, so the deadlock
				// detector picks us, and we back off like on a timeout.
				if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") {
					failed, lockErr, mode = l.Table, err, l.Mode
					break
				}
				return res, fmt.Errorf("lock table pgflow.%s in %s mode: %w", l.Table, l.Mode, err)
			}
			if i == 0 {
				firstHeld = time.Now()
			}
		}
		if failed == "" {
			// The statements after the locks get the full lock_timeout back.
			if _, err := tx.Exec(ctx, fmt.Sprintf(`set local lock_timeout = %d`, timeout.Milliseconds())); err != nil {
				return res, fmt.Errorf("restoring lock_timeout: %w", err)
			}
			if _, err := tx.Exec(ctx, `release savepoint pgflow_upgrade_locks`); err != nil {
				return res, fmt.Errorf("release savepoint after table locks: %w", err)
			}
			res.Held = start
			return res, nil
		}
		res.Waited += time.Since(start)
		if _, err := tx.Exec(ctx, `rollback to savepoint pgflow_upgrade_locks`); err != nil {
			return res, fmt.Errorf("rolling back to the savepoint after lock_timeout on pgflow.%s: %w", failed, err)
		}
		if attempt > retries {
			return res, &TableLockError{Table: failed, Mode: mode, Attempts: attempt, Timeout: timeout,
				Blockers: blockers(ctx, tx, failed, mode), Err: lockErr}
		}
		wait := jittered(delay)
		if onRetry != nil {
			onRetry(attempt, failed, wait)
		}
		if err := sleep(ctx, wait); err != nil {
			return res, err
		}
		delay = min(delay*2, 5*time.Second)
	}
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
