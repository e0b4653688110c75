package upgrade

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// Tables is every pgflow table the upgrade locks, in the documented lock
// order (docs/design.md "Lock order").
var Tables = []string{"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"}

// TableLock is one explicit lock apply takes, in the documented order.
type TableLock struct {
	Table  string // in Schema
	Mode   string // LOCK TABLE mode
	Schema string // "" is pgflow
}

// schema is the lock's schema, pgflow unless said.
func (l TableLock) schema() string {
	if l.Schema == "" {
		return "pgflow"
	}
	return l.Schema
}

// Name is the table's schema-qualified name as a person reads it.
func (l TableLock) Name() string { return l.schema() + "." + l.Table }

// ident is the table's quoted, schema-qualified name for SQL.
func (l TableLock) ident() string { return pgx.Identifier{l.schema(), l.Table}.Sanitize() }

// LockPlan is the fixed lock order of docs/design.md ("Lock order"), with
// the modes the migration file takes itself: the tables it alters (flows,
// steps, step_tasks) need ACCESS EXCLUSIVE anyway; the others only need writers
// stopped (EXCLUSIVE), so plain reads keep going. Taking exactly the file's
// modes first makes the file's own LOCK statements no-ops, which apply then
// does not send (runner.holds).
var LockPlan = []TableLock{
	{Table: "flows", Mode: "access exclusive"},
	{Table: "steps", Mode: "access exclusive"},
	{Table: "deps", Mode: "exclusive"},
	{Table: "runs", Mode: "exclusive"},
	{Table: "step_states", Mode: "exclusive"},
	{Table: "step_tasks", Mode: "access exclusive"},
	{Table: "workers", Mode: "exclusive"},
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
// text is never read: it may hold secrets (an autovacuum worker's, which
// PostgreSQL writes itself, is only tested for "to prevent wraparound").
type Blocker struct {
	PID             int32  `json:"pid"`
	User            string `json:"user"`
	ApplicationName string `json:"application_name"`
	// BackendType is pg_stat_activity.backend_type: "client backend" for
	// an application's session, "autovacuum worker" for PostgreSQL's own
	// vacuum of the table, or another server process.
	BackendType string `json:"backend_type"`
	// Wraparound: an autovacuum worker that vacuums to prevent transaction
	// id wraparound (neither PostgreSQL nor apply cancels it).
	Wraparound bool   `json:"wraparound,omitempty"`
	State      string `json:"state"`
	Mode       string `json:"mode"`
	Granted    bool   `json:"granted"`
	// XactSeconds: how long its transaction had been open when it was
	// looked at (clock_timestamp(), not the start of apply's own
	// transaction).
	XactSeconds int64 `json:"xact_seconds"`
}

// Autovacuum says whether b is PostgreSQL's autovacuum.
func (b Blocker) Autovacuum() bool { return b.BackendType == "autovacuum worker" }

func (b Blocker) String() string {
	g := "holds"
	if !b.Granted {
		g = "waits for"
	}
	var who string
	switch {
	case b.Autovacuum() && b.Wraparound:
		who = fmt.Sprintf("autovacuum worker, vacuuming to prevent wraparound (neither PostgreSQL nor apply cancels it: wait until it finishes), running %ds", b.XactSeconds)
	case b.Autovacuum():
		who = fmt.Sprintf("autovacuum worker, PostgreSQL's own vacuum of the table, running %ds", b.XactSeconds)
	case b.BackendType != "" && b.BackendType != "client backend":
		who = fmt.Sprintf("%s, transaction open %ds", b.BackendType, b.XactSeconds)
	default:
		user := "(unknown)"
		if b.User != "" {
			user = fmt.Sprintf("%q", b.User)
		}
		app := "(none set)"
		if b.ApplicationName != "" {
			app = fmt.Sprintf("%q", b.ApplicationName)
		}
		state := b.State
		if state == "" {
			state = "state unknown"
		}
		who = fmt.Sprintf("user %s, application %s, %s, transaction open %ds", user, app, state, b.XactSeconds)
	}
	return fmt.Sprintf("pid %d (%s) %s %s", b.PID, who, g, b.Mode)
}

// TableLockError says which table could not be locked within the bounds.
type TableLockError struct {
	Table    string // without its schema (Schema, "" is pgflow)
	Schema   string
	Mode     string
	Attempts int
	// Wait is the longest each attempt waited for this table: lock_timeout
	// for the first table of LockPlan, the shared budget of the later ones
	// (at most half of deadlock_timeout) for the others.
	Wait time.Duration
	// LockTimeout is the lock_timeout apply ran with.
	LockTimeout time.Duration
	Blockers    []Blocker
	// AutovacuumErr: why the autovacuum in the way could not be cancelled
	// (nil when there was none, or it was).
	AutovacuumErr error
	Err           error // the last lock_not_available error (*pgconn.PgError)
}

func (e *TableLockError) Error() string {
	var b strings.Builder
	bound := "lock_timeout"
	if e.Wait < e.LockTimeout {
		bound = fmt.Sprintf("the budget of the locks after the first, at most half of deadlock_timeout, below lock_timeout %s, "+
			"so that an application session queued behind apply never reaches its deadlock check", e.LockTimeout)
	}
	fmt.Fprintf(&b, "could not lock %s in %s mode: %d attempts, each waiting at most %s (%s); nothing was changed",
		TableLock{Table: e.Table, Schema: e.Schema}.Name(), strings.ToUpper(e.Mode), e.Attempts, e.Wait, bound)
	if len(e.Blockers) == 0 {
		b.WriteString("; the blocking session had finished when we looked")
	} else {
		b.WriteString("; in the way:")
		for _, bl := range e.Blockers {
			b.WriteString("\n  " + bl.String())
		}
	}
	for _, bl := range e.Blockers {
		if bl.Autovacuum() && !bl.Wraparound && e.AutovacuumErr != nil {
			fmt.Fprintf(&b, "\n%s: run apply as a superuser (it cancels the autovacuum before each attempt), or have a superuser run "+
				"select pg_catalog.pg_cancel_backend(%d) just before, or wait until the vacuum ends", AutovacuumNote(e.AutovacuumErr), bl.PID)
			break
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
	// Autovacuum counts the autovacuum workers cancelled before attempts.
	Autovacuum int
}

// lockTables takes plan (LockPlan, then the pgmq hop's tables when it
// runs) in order under the transaction's lock_timeout.
// A lock_not_available (or deadlock_detected) error rolls back to a savepoint taken before the
// first LOCK, which releases every table this attempt had locked, so the
// application is blocked at most one lock_timeout per attempt; then it backs
// off with jitter and tries again, retries times at most. Before each
// attempt it cancels an autovacuum worker holding a pgflow table
// (CancelAutovacuum): PostgreSQL would only do so for a waiter that waits
// longer than these attempts ever do.
//
// Deadlocks: the application takes these tables in both orders (start_flow
// flows then runs, complete_task runs then flows through a foreign-key
// check), so no fixed order avoids a cycle with it. Once the first table is
// held, the remaining locks share a budget below the server's
// deadlock_timeout: apply gives up and releases everything before an
// application session that waits on us reaches its deadlock check, so the
// application never sees 40P01; apply retries instead.
//
// progress, if set, hears each retry and each cancelled autovacuum.
func lockTables(ctx context.Context, tx pgx.Tx, plan []TableLock, timeout time.Duration, retries int, progress func(detail string)) (lockResult, error) {
	var res lockResult
	if progress == nil {
		progress = func(string) {}
	}
	var deadlockMS float64
	if err := tx.QueryRow(ctx, `select extract(epoch from pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval) * 1000`).Scan(&deadlockMS); err != nil {
		return res, fmt.Errorf("reading deadlock_timeout: %w", err)
	}
	rest := min(timeout, time.Duration(deadlockMS/2)*time.Millisecond)
	policy := pgretry.Policy{Retries: retries, Backoff: pgretry.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}}
	var failed *TableLock
	var avErr error
	err := pgretry.Retry(ctx, policy, pgretry.LockError,
		func(attempt int, _ error, wait time.Duration) {
			progress(fmt.Sprintf("%s busy (waited at most %s), attempt %d of %d, retrying in %s",
				failed.Name(), waitFor(plan, failed, timeout, rest), attempt, retries+1, wait.Round(time.Millisecond)))
		},
		func(attempt int) error {
			res.Attempts = attempt
			n, err := CancelAutovacuum(ctx, tx)
			switch {
			case err != nil && ctx.Err() != nil:
				return err
			case err != nil:
				if avErr == nil {
					progress(AutovacuumNote(err) + "; the lock attempts go on")
				}
				avErr = err
			case n > 0:
				res.Autovacuum += n
				progress(fmt.Sprintf("cancelled %d autovacuum worker(s) holding a pgflow table (it starts again later)", n))
			}
			start, l, err := lockAttempt(ctx, tx, plan, rest, timeout)
			if err != nil && pgretry.LockError(err) {
				failed = l
				res.Waited += time.Since(start)
				if _, rbErr := tx.Exec(ctx, `rollback to savepoint pgflow_upgrade_locks`); rbErr != nil {
					return fmt.Errorf("rolling back to the savepoint after lock_timeout on %s: %w", l.Name(), rbErr)
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
		bl := blockers(ctx, tx, *failed)
		autovacuumErr := avErr
		if !slices.ContainsFunc(bl, Blocker.Autovacuum) {
			autovacuumErr = nil
		}
		return res, &TableLockError{Table: failed.Table, Schema: failed.Schema, Mode: failed.Mode, Attempts: ex.Attempts, Wait: waitFor(plan, failed, timeout, rest),
			LockTimeout: timeout, Blockers: bl, AutovacuumErr: autovacuumErr, Err: ex.Err}
	}
	return res, err
}

// waitFor is the longest an attempt waits for l: lock_timeout for the first
// table of plan, the budget rest for the others (lockAttempt).
func waitFor(plan []TableLock, l *TableLock, timeout, rest time.Duration) time.Duration {
	if l == &plan[0] {
		return timeout
	}
	return rest
}

// lockAttempt is one try at plan under a savepoint. The first lock waits
// up to timeout; the others share a budget of rest from the first grant.
// On a lock error it returns the table it failed on (the caller rolls back
// to the savepoint, which releases every lock this attempt took).
//
// The statements go to the server as one pipeline (a pgx batch: one round
// trip, not two per table): the time between two grants is the server's
// alone, and the application waits on the tables already locked no longer
// than that. So the server keeps the budget's clock: the first grant's
// time is set as a setting of the savepoint, and each later lock_timeout
// is what is left of rest since then (at least 1ms: a budget used up
// still bounds the wait). The first statement that fails names the table;
// the server skips the rest of the pipeline.
func lockAttempt(ctx context.Context, tx pgx.Tx, plan []TableLock, rest, timeout time.Duration) (time.Time, *TableLock, error) {
	start := time.Now()
	b := &pgx.Batch{}
	type step struct {
		what string
		lock *TableLock
	}
	var steps []step
	queue := func(what string, lock *TableLock, sql string, args ...any) {
		b.Queue(sql, args...)
		steps = append(steps, step{what, lock})
	}
	queue("savepoint before table locks", nil, `savepoint pgflow_upgrade_locks`)
	for i := range plan {
		l := &plan[i]
		if i > 0 {
			queue("setting the lock budget", nil, `select pg_catalog.set_config('lock_timeout',
				greatest(1, pg_catalog.floor($1::pg_catalog.float8 operator(pg_catalog.-) (extract(epoch from pg_catalog.clock_timestamp()
					operator(pg_catalog.-) pg_catalog.current_setting('pgflow_upgrade.first_lock')::pg_catalog.timestamptz) operator(pg_catalog.*) 1000)))::pg_catalog.int8::pg_catalog.text
				operator(pg_catalog.||) 'ms', true)`, float64(rest.Milliseconds()))
		}
		// The identifier is quoted; modes are constants of this package.
		queue("lock table "+l.Name()+" in "+l.Mode+" mode", l, `lock table `+l.ident()+` in `+l.Mode+` mode`)
		if i == 0 {
			queue("noting the first grant", nil, `select pg_catalog.set_config('pgflow_upgrade.first_lock', pg_catalog.clock_timestamp()::pg_catalog.text, true)`)
		}
	}
	// The statements after the locks get the full lock_timeout back.
	queue("restoring lock_timeout", nil, `select pg_catalog.set_config('lock_timeout', $1, true)`, fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1)))
	queue("release savepoint after table locks", nil, `release savepoint pgflow_upgrade_locks`)
	br := tx.SendBatch(ctx, b)
	var failed *TableLock
	var err error
	for _, st := range steps {
		if _, e := br.Exec(); e != nil {
			failed, err = st.lock, e
			if failed == nil || !pgretry.LockError(e) {
				failed, err = nil, fmt.Errorf("%s: %w", st.what, e)
			}
			break
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("table locks: %w", cerr)
	}
	return start, failed, err
}

// blockers lists the other sessions with a lock on l's table that
// conflicts with its mode, best effort (an error gives an empty list).
func blockers(ctx context.Context, tx pgx.Tx, l TableLock) []Blocker {
	out, _ := lockHolders(ctx, tx, l)
	return out
}

// LockHolders lists the other sessions of this database that hold or wait
// for a lock on pgflow.<table> conflicting with mode (a LOCK TABLE mode of
// LockPlan), granted first: who the lock error names.
//
// In a transaction that read pg_stat_activity before, the rows would be the
// ones of that first read (the server keeps them for the transaction), so
// the snapshot is dropped first: a holder that came since is named too.
func LockHolders(ctx context.Context, q Querier, table, mode string) ([]Blocker, error) {
	return lockHolders(ctx, q, TableLock{Table: table, Mode: mode})
}

// lockHolders is LockHolders for a table of any schema.
func lockHolders(ctx context.Context, q Querier, l TableLock) ([]Blocker, error) {
	table, mode := l.Name(), l.Mode
	want, ok := conflicts[mode]
	if !ok {
		return nil, fmt.Errorf("lock holders: unknown lock mode %q", mode)
	}
	if _, err := q.Exec(ctx, `select pg_catalog.pg_stat_clear_snapshot()`); err != nil {
		return nil, fmt.Errorf("lock holders of %s: %w", table, err)
	}
	rows, err := q.Query(ctx, `
		select l.pid, coalesce(a.usename::pg_catalog.text, ''), coalesce(a.application_name, ''),
		       coalesce(a.backend_type, ''), coalesce(a.query operator(pg_catalog.~~) '%to prevent wraparound%', false),
		       coalesce(a.state, ''), l.mode, l.granted,
		       coalesce(pg_catalog.round(extract(epoch from pg_catalog.clock_timestamp() operator(pg_catalog.-) a.xact_start))::pg_catalog.int8, 0)
		  from pg_catalog.pg_locks l
		  left join pg_catalog.pg_stat_activity a on a.pid operator(pg_catalog.=) l.pid
		 where l.locktype operator(pg_catalog.=) 'relation'
		   and l.database operator(pg_catalog.=) (select d.oid from pg_catalog.pg_database d
		                                           where d.datname operator(pg_catalog.=) pg_catalog.current_database())
		   and l.relation operator(pg_catalog.=) pg_catalog.to_regclass($1)
		   and l.pid operator(pg_catalog.<>) pg_catalog.pg_backend_pid()
		   and l.mode operator(pg_catalog.=) any($2)
		 order by l.granted desc, l.pid`, l.ident(), want)
	if err != nil {
		return nil, fmt.Errorf("lock holders of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Blocker, error) {
		var b Blocker
		err := r.Scan(&b.PID, &b.User, &b.ApplicationName, &b.BackendType, &b.Wraparound, &b.State, &b.Mode, &b.Granted, &b.XactSeconds)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("lock holders of %s: %w", table, err)
	}
	return out, nil
}
