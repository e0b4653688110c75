package online

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgretry"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// Defaults of Options (also the CLI's flag defaults).
const (
	DefaultBatchSize     = 5000
	DefaultBatchTime     = 100 * time.Millisecond
	DefaultLockTimeout   = 50 * time.Millisecond // below deadlock_timeout (1s): we give up first
	DefaultLockRetries   = 60
	DefaultMaxReplicaLag = 10 * time.Second
	DefaultWait          = 30 * time.Second
)

// Options of Upgrade. Zero values take the defaults.
type Options struct {
	// BatchSize: the most rows one backfill batch updates; the batch size
	// adapts below it so a batch takes about BatchTime.
	BatchSize int
	BatchTime time.Duration
	// MaxRate: rows per second the backfill stays under (0: no limit).
	MaxRate float64
	// Pause between backfill batches.
	Pause time.Duration
	// MaxReplicaLag: the backfill waits while a standby's replay_lag
	// (pg_stat_replication) is above it. Negative: do not look.
	MaxReplicaLag time.Duration
	// LockTimeout bounds every lock wait of the short DDL transactions
	// (expand, the NOT VALID check, the switch); LockRetries of each, with
	// backoff and jitter.
	LockTimeout time.Duration
	LockRetries int
	// Wait: how long to poll for the online lock of another run.
	Wait time.Duration
	// Progress, if set, is told about phases and batches.
	Progress func(Event)
	// Preflight options (sample, per-check timeout) for both preflights.
	Preflight audit.Options
	// Switch: base options of the switch (upgrade.Apply): Verify,
	// Migrations, Hooks, Wait. Its locks, preflight selection and state
	// acceptance are set by Upgrade.
	Switch upgrade.Options
	// Hooks are for tests.
	Hooks Hooks
}

// Hooks let tests act at named points (see Point* constants).
type Hooks struct {
	At func(ctx context.Context, pid uint32, point string) error
}

// Points where Hooks.At is called.
const (
	PointPreflight = "preflight"
	PointExpand    = "expand"
	PointBatch     = "backfill.batch"
	PointCheck     = "contract.check" // the function and the checks NOT VALID
	PointValidate  = "contract.validate"
	PointIndex     = "contract.index" // before each unique index build
	PointSwitch    = "switch"
)

func (o Options) withDefaults() Options {
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.BatchTime <= 0 {
		o.BatchTime = DefaultBatchTime
	}
	if o.MaxReplicaLag == 0 {
		o.MaxReplicaLag = DefaultMaxReplicaLag
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LockRetries <= 0 {
		o.LockRetries = DefaultLockRetries
	}
	if o.Wait < 0 {
		o.Wait = 0
	}
	if o.Switch.Verify == nil {
		o.Switch.Verify = migrations.Verify
	}
	if o.Preflight.CheckTimeout <= 0 {
		o.Preflight.CheckTimeout = time.Minute // the first preflight is exact and takes no lock
	}
	return o
}

// Event is a progress notification.
type Event struct {
	Phase   Phase
	Done    bool
	Detail  string
	Elapsed time.Duration
	// Backfill: rows done (over all runs) and the estimated total, the rate
	// of this run in rows/s.
	Rows, Total int64
	Rate        float64
}

// PhaseTiming is one phase of the report.
type PhaseTiming struct {
	Phase      Phase  `json:"phase"`
	DurationMS int64  `json:"duration_ms"`
	Detail     string `json:"detail,omitempty"`
}

// LockWindow is one short DDL transaction: how often its locks were tried
// and how long the successful attempt held them.
type LockWindow struct {
	Step     string `json:"step"`
	Attempts int    `json:"attempts"`
	WindowMS int64  `json:"window_ms"`
}

// BackfillStats is what this run's backfill did.
type BackfillStats struct {
	Steps   int64 `json:"steps"` // pgflow.steps rows filled
	Rows    int64 `json:"rows"`  // pgflow.step_tasks rows filled
	Batches int64 `json:"batches"`
	Passes  int   `json:"passes"` // passes this run finished
	// Pass is the pass this run worked on last (the one status shows; 0:
	// this run did not backfill step_tasks).
	Pass          int     `json:"pass"`
	SkippedLocked int64   `json:"skipped_locked"` // rows busy in an application transaction, retried
	ReplicaWaitMS int64   `json:"replica_wait_ms"`
	Rate          float64 `json:"rate"`
	LongestMS     int64   `json:"longest_batch_ms"`
}

// Report says what Upgrade did (outcome.Result's Report), also when it failed.
type Report struct {
	StartPhase Phase               `json:"start_phase"`
	Resumed    bool                `json:"resumed"`
	Phases     []PhaseTiming       `json:"phases"`
	Preflight  []audit.CheckResult `json:"preflight"`
	Blockers   []audit.Finding     `json:"blockers"`
	Backfill   BackfillStats       `json:"backfill"`
	Locks      []LockWindow        `json:"locks"`
	// LongestLockWindowMS over the expand, check and switch transactions.
	LongestLockWindowMS int64 `json:"longest_lock_window_ms"`
	// CatchUp: the transaction that took an older release to 0.16.0
	// first (upstream's files, upgrade.Apply; catchup.go).
	CatchUp *outcome.Result[*upgrade.Report] `json:"catch_up,omitempty"`
	// Switch: the result of the switch transaction (upgrade.Apply).
	Switch  *outcome.Result[*upgrade.Report] `json:"switch,omitempty"`
	TotalMS int64                            `json:"total_ms"`
}

// Errors of Upgrade (refusals: exit 1).
var (
	ErrRefused   = errors.New("apply --online refused")
	ErrDuplicate = errors.New("rows 0.17.0's unique indexes refuse (slugs differing only by case, or tasks sharing a (queue, message id)): the unique index cannot be built")
)

type engine struct {
	conn  *pgx.Conn
	opts  Options
	res   *outcome.Result[*Report]
	rep   *Report // res.Report
	pid   uint32
	shape Shape // what the catalog said last: the plan's operations read it and refresh it
	// windowFrom: the first LOCK TABLE of the current ddlTx attempt
	// (lockWindowStarts), zero until then.
	windowFrom time.Time
}

func newEngine(conn *pgx.Conn, opts Options) *engine {
	res := &outcome.Result[*Report]{Report: &Report{}}
	return &engine{conn: conn, opts: opts, res: res, rep: res.Report, pid: conn.PgConn().PID()}
}

// Upgrade runs (or continues) the online upgrade on conn: a direct session
// (not a transaction-mode pooler: CREATE INDEX CONCURRENTLY and the
// session lock need one). The result is never nil; its outcome and the
// error follow internal/upgrade's rule.
func Upgrade(ctx context.Context, conn *pgx.Conn, opts Options) (*outcome.Result[*Report], error) {
	e := newEngine(conn, opts.withDefaults())
	start := time.Now()
	err := outcome.Settle(ctx, conn, e.res, e.run(ctx))
	e.rep.TotalMS = time.Since(start).Milliseconds()
	if o := e.res.Outcome; o == outcome.Interrupted || o == outcome.Failed {
		e.res.Message += "; run apply --online again to continue from where it stopped (or apply --rollback-online to undo)"
	}
	return e.res, err
}

func (e *engine) hook(ctx context.Context, point string) error {
	if e.opts.Hooks.At == nil {
		return nil
	}
	if err := e.opts.Hooks.At(ctx, e.pid, point); err != nil {
		return fmt.Errorf("test hook at %s: %w", point, err)
	}
	return nil
}

func (e *engine) event(ev Event) {
	if e.opts.Progress != nil {
		e.opts.Progress(ev)
	}
}

// phase times fn as one phase of the report.
func (e *engine) phase(ph Phase, detail string, fn func() error) error {
	e.event(Event{Phase: ph, Detail: detail})
	t := time.Now()
	err := fn()
	el := time.Since(t)
	e.rep.Phases = append(e.rep.Phases, PhaseTiming{Phase: ph, DurationMS: el.Milliseconds(), Detail: detail})
	e.event(Event{Phase: ph, Done: true, Detail: detail, Elapsed: el})
	return err
}

func (e *engine) run(ctx context.Context) error {
	if err := e.opts.Switch.Verify(); err != nil {
		e.res.Outcome = outcome.Refused
		return fmt.Errorf("%w: %w", upgrade.ErrIntegrity, err)
	}
	release, err := sessionLock(ctx, e.conn, e.opts.Wait)
	if err != nil {
		if errors.Is(err, ErrBusy) {
			e.res.Outcome = outcome.LockBusy
		}
		return err
	}
	defer release()

	if err := e.catchUp(ctx); err != nil {
		return err
	}
	s, err := ReadShape(ctx, e.conn)
	if err != nil {
		return err
	}
	e.rep.StartPhase = s.Phase()
	e.rep.Resumed = s.Started()
	// An open apply --quiesce record is closed only by --resume-quiesce:
	// refused now, not at the switch after a whole backfill.
	if o, err := upgrade.CheckQuiesce(ctx, e.conn, e.opts.Switch.Quiesce); err != nil {
		e.res.Outcome = o
		return err
	}
	if !s.Pgflow {
		e.res.Outcome = outcome.Refused
		return fmt.Errorf("%w: %w: no pgflow.step_tasks", ErrRefused, upgrade.ErrNotBaseline)
	}
	e.shape = s
	for _, op := range plan() { // plan.go
		needed, err := op.needed(e, ctx)
		if err != nil {
			return err
		}
		if !needed {
			continue
		}
		if err := e.phase(op.phase, op.detail, func() error { return op.run(e, ctx) }); err != nil {
			return err
		}
	}
	return nil
}

// preflightBefore runs the preflight checks (all but the duplicate scan) exactly, before anything
// changes, in a transaction of its own without table locks: a blocker
// refuses with the database unchanged (or, on a rerun, as it was).
func (e *engine) preflightBefore(ctx context.Context) error {
	if err := e.hook(ctx, PointPreflight); err != nil {
		return err
	}
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("online: beginning the preflight transaction: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	po := e.opts.Preflight
	// Not the duplicate (queue, message id) scan: the unique index build of
	// the contract phase answers it (refuseDuplicates), at no extra cost.
	po.Checks = preflightIDs("schema.state", "tasks.duplicate_message_id")
	po.Extra = append(append([]audit.Check(nil), po.Extra...), stateCheck())
	po.ApplicationName = "pgflow-upgrade apply --online"
	res, err := preflight.Run(ctx, tx, po)
	e.rep.Preflight = res.Checks
	if err != nil {
		return err
	}
	if !res.OK() {
		e.rep.Blockers = res.Blockers()
		var err error
		e.res.Outcome, err = outcome.FromPreflight(res)
		return err
	}
	return nil
}

// switchTx runs the switch on a prepared shape, or reports an upgraded
// database (dropping our schema if something left it).
func (e *engine) switchTx(ctx context.Context) error {
	if s := e.shape; s.Upgraded && s.Progress {
		if _, err := e.conn.Exec(ctx, dropBookkeeping); err != nil {
			return fmt.Errorf("online: dropping the leftover online bookkeeping: %w", err)
		}
	}
	if err := e.hook(ctx, PointSwitch); err != nil {
		return err
	}
	e.cancelAutovacuum(ctx)
	sw, err := upgrade.Apply(ctx, e.conn, e.switchOptions())
	e.rep.Switch = sw
	e.rep.Preflight = append(e.rep.Preflight, sw.Report.Preflight...)
	e.rep.Blockers = append(e.rep.Blockers, sw.Report.Blockers...)
	if sw.Report.LockAttempts > 0 {
		e.lockWindow("switch", sw.Report.LockAttempts, time.Duration(sw.Report.LockWindowMS)*time.Millisecond)
	}
	e.res.Outcome, e.res.Message = sw.Outcome, sw.Message
	if err != nil {
		return err
	}
	if sw.Outcome == outcome.Applied {
		e.res.Message = fmt.Sprintf("upgraded online: %s; the longest lock window was %d ms", strings.Join(sw.Report.Pending, ", "), e.rep.LongestLockWindowMS)
	}
	return nil
}

func (e *engine) switchOptions() upgrade.Options {
	o := e.opts.Switch
	o.DryRun = false
	o.LockTimeout = e.opts.LockTimeout
	o.LockRetries = e.opts.LockRetries
	if o.Wait == 0 {
		o.Wait = e.opts.Wait
	}
	po := e.opts.Preflight
	// Under the locks run only the blockers the prepared shape does not
	// already prove, exact: the warnings ran in the first preflight (they
	// cannot refuse); the case aliases and the duplicate (queue, message id)
	// are proven by the valid unique indexes (and the validated checks:
	// queue_name = lower(flow_slug) everywhere), which preparedCheck finds in
	// the catalog; the schema state is partial by design here. Each check
	// costs the application lock window time, whatever it finds.
	po.Checks = switchChecks()
	po.Extra = append(append([]audit.Check(nil), po.Extra...), preparedCheck())
	po.CheckTimeout = e.opts.Switch.Preflight.CheckTimeout
	if po.CheckTimeout <= 0 {
		po.CheckTimeout = 5 * time.Second
	}
	o.Preflight = po
	o.AcceptState = func(ctx context.Context, tx pgx.Tx, st versions.SchemaInfo) (bool, error) {
		s, err := ReadShape(ctx, tx)
		if err != nil {
			return false, err
		}
		return s.Prepared() && baselineOrOnline(st), nil
	}
	o.BeforeCommit = func(ctx context.Context, tx pgx.Tx) error {
		// The online bookkeeping goes with the switch (the file has dropped
		// the triggers): nothing of the online upgrade is left once the
		// upgrade is committed. Schema pgflow_upgrade stays: the ledger.
		if _, err := tx.Exec(ctx, dropBookkeeping); err != nil {
			return fmt.Errorf("online: dropping the online bookkeeping in the switch: %w", err)
		}
		return nil
	}
	prog := e.opts.Progress
	if prog != nil {
		o.Progress = func(ev upgrade.Event) {
			prog(Event{Phase: PhaseSwitch, Done: ev.Done, Detail: ev.Step + ": " + ev.Detail, Elapsed: ev.Elapsed})
		}
	}
	return o
}

// switchChecks: audit's Preflight blockers, minus the ones the prepared
// shape proves (see switchOptions).
func switchChecks() []string {
	var out []string
	for _, id := range preflightIDs("schema.state", "tasks.duplicate_message_id", "flows.case_alias", "steps.case_alias") {
		if c, err := audit.Lookup(id); err == nil && c.Severity == audit.Blocker {
			out = append(out, id)
		}
	}
	return out
}

func (e *engine) lockWindow(step string, attempts int, d time.Duration) {
	e.rep.Locks = append(e.rep.Locks, LockWindow{Step: step, Attempts: attempts, WindowMS: d.Milliseconds()})
	if d.Milliseconds() > e.rep.LongestLockWindowMS {
		e.rep.LongestLockWindowMS = d.Milliseconds()
	}
}

// sessionLock takes OnlineLockKey (session level), polling up to wait.
func sessionLock(ctx context.Context, conn *pgx.Conn, wait time.Duration) (release func(), err error) {
	err = pgretry.Poll(ctx, wait, func(ctx context.Context) (bool, error) {
		var ok bool
		if err := conn.QueryRow(ctx, `select pg_catalog.pg_try_advisory_lock($1)`, OnlineLockKey).Scan(&ok); err != nil {
			return false, fmt.Errorf("online: taking the online advisory lock: %w", err)
		}
		return ok, nil
	})
	if errors.Is(err, pgretry.ErrNotAcquired) {
		return nil, fmt.Errorf("%w; waited %s (--wait)", ErrBusy, wait)
	}
	if err != nil {
		return nil, err
	}
	return func() {
		// A broken connection has lost the lock with its session.
		if !conn.IsClosed() {
			_, _ = conn.Exec(context.WithoutCancel(ctx), `select pg_catalog.pg_advisory_unlock($1)`, OnlineLockKey)
		}
	}, nil
}

// retryable: a bounded lock wait that gave up (pgretry.LockError), or
// apply's advisory lock taken.
func retryable(err error) bool {
	return pgretry.LockError(err) || errors.Is(err, errApplyBusy)
}

// idleTimeout ends the session of a client that stops inside one of the
// online path's transactions (SIGSTOP, a frozen VM), so its locks go: the
// engine never pauses inside a transaction (its backoff and throttle sleeps
// are between them), so a few seconds are plenty.
const idleTimeout = 5 * time.Second

var errApplyBusy = errors.New("the upgrade advisory lock is held (a transactional apply is running)")

// ddlTx runs fn in a short transaction that holds upgrade.AdvisoryLockKey
// (tried, never waited for in the lock queue), with SET LOCAL lock_timeout:
// every lock wait inside is bounded by LockTimeout, so the application
// queues behind us at most that long per attempt. A timeout or deadlock
// rolls the whole attempt back (releasing what it had locked), then it is
// retried with exponential backoff and jitter, LockRetries times.
func (e *engine) ddlTx(ctx context.Context, step string, fn func(tx pgx.Tx) error) error {
	var held time.Time
	policy := pgretry.Policy{Retries: e.opts.LockRetries, Backoff: pgretry.Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}}
	attempts := 0
	err := pgretry.Retry(ctx, policy, retryable,
		func(attempt int, err error, w time.Duration) {
			e.event(Event{Phase: PhaseNone, Detail: fmt.Sprintf("%s: busy (%v), attempt %d of %d, retrying in %s", step, shortErr(err), attempt, e.opts.LockRetries+1, w.Round(time.Millisecond))})
		},
		func(attempt int) error {
			attempts = attempt
			e.cancelAutovacuum(ctx)
			tx, err := e.conn.Begin(ctx)
			if err != nil {
				return fmt.Errorf("online %s: begin: %w", step, err)
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			var ok bool
			if err := tx.QueryRow(ctx, `select pg_catalog.pg_try_advisory_xact_lock($1)`, upgrade.AdvisoryLockKey).Scan(&ok); err != nil {
				return fmt.Errorf("online %s: taking the upgrade advisory lock: %w", step, err)
			}
			if !ok {
				return errApplyBusy
			}
			if err := (session.Limits{Lock: e.opts.LockTimeout, Statement: 60 * time.Second, IdleInTransaction: idleTimeout}).Set(ctx, tx); err != nil {
				return fmt.Errorf("online %s: setting lock_timeout: %w", step, err)
			}
			held, e.windowFrom = time.Now(), time.Time{}
			if err := fn(tx); err != nil {
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return fmt.Errorf("online %s: commit: %w", step, err)
			}
			return nil
		})
	var ex *pgretry.ExhaustedError
	if errors.As(err, &ex) {
		e.res.Outcome = outcome.LockBusy
		return fmt.Errorf("online %s: locks not obtained in %d attempts, each waiting at most %s (lock_timeout)%s; nothing of this step was changed: %w",
			step, ex.Attempts, e.opts.LockTimeout, e.holders(ctx), ex.Err)
	}
	if err == nil {
		if !e.windowFrom.IsZero() {
			held = e.windowFrom
		}
		e.lockWindow(step, attempts, time.Since(held))
	}
	return err
}

// lockWindowStarts marks, in a ddlTx, the first LOCK TABLE: the work
// before it (reading the catalog, creating a function of ours) blocks no
// application session, so the lock window is measured from here.
func (e *engine) lockWindowStarts() {
	if e.windowFrom.IsZero() {
		e.windowFrom = time.Now()
	}
}

// holders names the sessions that hold a lock on the tables the online
// steps alter, read when the attempts are spent (best effort: "" when there
// are none or they cannot be read), as apply's own lock error does.
func (e *engine) holders(ctx context.Context) string {
	var parts []string
	for _, table := range append([]string{"flows"}, Tables...) {
		// Every mode conflicts with ACCESS EXCLUSIVE: every holder is listed.
		hs, err := upgrade.LockHolders(ctx, e.conn, table, "access exclusive")
		if err != nil || len(hs) == 0 {
			continue
		}
		names := make([]string, len(hs))
		for i, h := range hs {
			names[i] = h.String()
		}
		parts = append(parts, "pgflow."+table+": "+strings.Join(names, "; "))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; the sessions holding locks on the pgflow tables now (end or cancel them, or wait for them, then run apply --online again): " + strings.Join(parts, "; ")
}

func shortErr(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code + " " + pgErr.Message
	}
	return err.Error()
}
