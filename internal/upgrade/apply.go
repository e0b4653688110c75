package upgrade

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// Version and Name of our migration (migrations/), recorded in the tool's own
// schema (pgflow_upgrade.schema_revisions) when apply commits it.
const (
	Version = "20261203100000"
	Name    = "pgflow_private_step_queues"
)

// Upstream pgflow's own migration to the same 0.17.0 schema: the Supabase
// ledger records this version as applied, so `supabase migration up` /
// `db push` skips the user's copy of the file.
const (
	UpstreamVersion = "20260915074120"
	UpstreamName    = "pgflow_private_step_queues"
)

// Defaults of Options (also the CLI's flag defaults).
const (
	DefaultWait        = 30 * time.Second
	DefaultLockTimeout = 2 * time.Second
	DefaultLockRetries = 5
)

// idleTimeout bounds a client that hangs inside apply's transaction (stopped
// with SIGSTOP, a frozen VM): the server ends the session and its locks go
// with it. It is just above apply's own longest pause in the transaction,
// the backoff between table-lock attempts (under 5 s, locks.go) and
// between advisory-lock polls (under 1 s); everything else in the
// transaction is statements, during which a session is not idle.
const idleTimeout = 6 * time.Second

// Options of Apply. Zero values take the defaults.
type Options struct {
	DryRun bool
	// Wait: how long to poll for the advisory lock held by another apply
	// (0: one try; the CLI's default is DefaultWait).
	Wait time.Duration
	// LockTimeout: SET LOCAL lock_timeout once the advisory lock is held;
	// bounds each table-lock attempt (and every later lock wait).
	LockTimeout time.Duration
	// LockRetries: attempts after the first before giving up on the locks.
	LockRetries int
	// Progress, if set, is told when each step starts and ends.
	Progress func(Event)
	// Preflight options (sample size, per-check timeout).
	Preflight audit.Options
	// SupabaseDir, if set, is the project's supabase/migrations folder: the
	// user's copy of upstream's 0.17.0 migration (*_pgflow_private_step_queues.sql)
	// found there is recorded as applied in supabase_migrations.schema_migrations,
	// in the same transaction. Unset: the report says which
	// `supabase migration repair` command to run.
	SupabaseDir string
	// To is the release to end at (versions.Releases, 0.17.0 or later;
	// "": upstream's newest). "0.17.0" is this tool's own hop alone.
	To string
	// PgflowMigrations is the folder holding the user's copy of upstream's
	// migration files, recognised by content (hops.go); "": SupabaseDir.
	// Without upstream's files the plan ends where this tool's own hops
	// end and the report says what the rest needs.
	PgflowMigrations string
	// TelemetryOff opts out of pgflow's telemetry job in the same
	// transaction (upstream's pgflow_telemetry.disable()) when the plan
	// reaches 0.17.1 or starts there. Unset: upstream's default.
	TelemetryOff bool
	// Verify checks the migrations' integrity (default migrations.Verify);
	// Migrations lists them (default migrations.All). Tests substitute them.
	Verify     func() error
	Migrations func() ([]migrations.Migration, error)
	// Hooks are for tests only: they run inside the transaction.
	Hooks Hooks

	// AcceptState, if set, may accept a schema state other than the 0.16.0
	// baseline as the start of the migration: `apply --online`
	// (internal/online) uses it for its final switch on the shape it
	// prepared. It runs in the transaction, under the advisory lock.
	AcceptState func(ctx context.Context, tx pgx.Tx, st versions.SchemaInfo) (bool, error)
	// BeforeCommit, if set, runs in the transaction after the post-conditions
	// (internal/online drops its progress schema there, atomically).
	BeforeCommit func(ctx context.Context, tx pgx.Tx) error
	// Quiesce, if set, runs the transaction inside internal/quiesce's
	// pause, deprecate, drain ... restore (apply --quiesce; quiesce.go).
	Quiesce *quiesce.Options
	// PGMQ, if set, is the pgmq version to update to after the pgflow
	// hops (apply --pgmq; pgmqhop.go), in the same transaction; alone when
	// pgflow has no hop to run.
	PGMQ string

	// quiesced: this transaction runs inside quiesce.Run, whose own record
	// is open; any other apply refuses on an open record (inprogress.go).
	quiesced bool
}

// Hooks let tests act at exact points of the transaction (e.g. terminate the
// backend before a given statement). A hook error aborts apply.
type Hooks struct {
	// BeforeStep runs before each named step (see Step* constants).
	BeforeStep func(ctx context.Context, pid uint32, step string) error
	// BeforeStatement runs before statement index (0-based) of migration m.
	BeforeStatement func(ctx context.Context, pid uint32, m migrations.Migration, index int, stmt string) error
}

func (o Options) withDefaults() Options {
	if o.Wait < 0 {
		o.Wait = 0
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LockRetries < 0 {
		o.LockRetries = 0
	}
	if o.Verify == nil {
		o.Verify = migrations.Verify
	}
	if o.Migrations == nil {
		o.Migrations = migrations.All
	}
	return o
}

// Steps of apply, in order.
const (
	StepIntegrity    = "integrity"
	StepBegin        = "begin"
	StepAdvisoryLock = "advisory_lock"
	StepState        = "state"
	StepPrivileges   = "privileges"
	StepTableLocks   = "table_locks"
	StepPreflight    = "preflight"
	StepMigrate      = "migrate"
	StepPostChecks   = "post_conditions"
	StepSupabase     = "supabase_record"
	StepCommit       = "commit"
	StepRollback     = "rollback"
)

// Event is a progress notification.
type Event struct {
	Step    string
	Done    bool          // false: starting; true: finished
	Detail  string        // e.g. the statement being run
	Elapsed time.Duration // when Done
}

// StepTiming is one step of the report.
type StepTiming struct {
	Step       string `json:"step"`
	DurationMS int64  `json:"duration_ms"`
	Detail     string `json:"detail,omitempty"`
}

// StatementReport is one statement of a migration that ran.
type StatementReport struct {
	Migration  string `json:"migration"`
	Index      int    `json:"index"`
	Summary    string `json:"summary"`
	DurationMS int64  `json:"duration_ms"`
	DurationUS int64  `json:"duration_us"` // the same, finer: most statements take well under 1 ms
	Rows       int64  `json:"rows"`
}

// Report says what apply did (Result.Report), also when it failed.
type Report struct {
	DryRun bool                `json:"dry_run"`
	State  versions.SchemaInfo `json:"state_before"`
	// PgflowVersion: which pgflow apply found before it changed anything,
	// and the next step (the same object status and audit print).
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	// After a successful apply (outcome applied): the version the database
	// has now and what to do next; PgflowVersion stays what was found before.
	VersionNow string   `json:"pgflow_version_now,omitempty"`
	NextStep   string   `json:"next_step,omitempty"`
	Pending    []string `json:"pending"`
	// Unknown: revisions recorded in the database that no embedded migration has.
	Unknown    []string          `json:"unknown_revisions,omitempty"`
	Steps      []StepTiming      `json:"steps"`
	Statements []StatementReport `json:"statements"`
	// LockAttempts: how many times the table locks were tried.
	LockAttempts int `json:"lock_attempts"`
	// LockWindowMS: from the first LOCK of the successful attempt to the end
	// of commit (or rollback): how long the application was locked out.
	LockWindowMS int64 `json:"lock_window_ms"`
	// LockWaitMS: time spent in failed lock attempts (each bounded by the lock timeout).
	LockWaitMS     int64               `json:"lock_wait_ms"`
	Preflight      []audit.CheckResult `json:"preflight"`
	Blockers       []audit.Finding     `json:"blockers"`
	PostConditions []CheckOutcome      `json:"post_conditions"`
	// Plan: the hops from the release found to the one asked for.
	Plan *Plan `json:"plan,omitempty"`
	// HopsApplied: the upstream files run (HopUpstream hops), in order.
	HopsApplied []string `json:"hops_applied,omitempty"`
	// Telemetry: what this apply did about pgflow's telemetry job.
	Telemetry        string         `json:"telemetry,omitempty"`
	SupabaseRecorded bool           `json:"supabase_recorded"`
	Supabase         string         `json:"supabase,omitempty"`
	Quiesce          *QuiesceReport `json:"quiesce,omitempty"`
	// PGMQ: the pgmq hop, when apply --pgmq ran it.
	PGMQ       *PGMQReport `json:"pgmq,omitempty"`
	TotalMS    int64       `json:"total_ms"`
	BackendPID uint32      `json:"-"`

	// AutovacuumCancelled counts the autovacuum workers on pgflow tables
	// cancelled before the lock attempts (CancelAutovacuum).
	AutovacuumCancelled int `json:"autovacuum_cancelled,omitempty"`
}

// Refusal errors (exit 1): the database is unchanged.
var (
	ErrIntegrity      = errors.New("integrity check failed, refusing to run the migrations")
	ErrNotBaseline    = errors.New("the database is not the pgflow 0.16.0 baseline this migration starts from")
	ErrNewerSchema    = errors.New("the database has a newer, unknown schema revision")
	ErrPostConditions = errors.New("the post-conditions failed after the migration: rolled back, nothing was changed")
)

// Apply runs the pending migrations on conn in one transaction:
//
//  1. integrity: the embedded migrations against atlas.sum;
//  2. BEGIN; advisory lock pg_try_advisory_xact_lock(AdvisoryLockKey), polled
//     with backoff up to Options.Wait; then SET LOCAL lock_timeout;
//  3. schema state: already upgraded → no-op; anything but the 0.16.0
//     baseline → refuse;
//  4. privileges (before any lock, so a role that cannot upgrade never queues);
//  5. LOCK TABLE in the documented order (LockPlan), each attempt bounded by
//     lock_timeout, rolled back to a savepoint on failure, retried with
//     backoff and jitter Options.LockRetries times;
//  6. the preflight checks of the shared catalog, exact, under the locks;
//  7. the migration, statement by statement;
//  8. post-conditions (Checks);
//  9. the revision also in supabase_migrations.schema_migrations, if present;
//  10. COMMIT (or ROLLBACK with DryRun).
//
// Steps 6-8 follow the plan (hops.go) from the release found to
// Options.To: upstream's files before and after this tool's migration run
// in the same transaction, each with its own checks and its Supabase
// ledger row, after the blocking ones were built beforehand (prebuild.go).
//
// Any failure rolls everything back. The result is never nil; its outcome
// and the error follow the package's rule (checks.go).
func Apply(ctx context.Context, conn *pgx.Conn, opts Options) (*outcome.Result[*Report], error) {
	if opts.Quiesce != nil {
		return applyQuiesced(ctx, conn, opts) // quiesce.go
	}
	opts = opts.withDefaults()
	res := &outcome.Result[*Report]{Report: &Report{DryRun: opts.DryRun, BackendPID: conn.PgConn().PID()}}
	start := time.Now()
	defer func() { res.Report.TotalMS = time.Since(start).Milliseconds() }()
	err := apply(ctx, conn, opts, res)
	return res, outcome.Settle(ctx, conn, res, err)
}

// runner times steps and tells Progress about them.
type runner struct {
	ctx  context.Context
	opts Options
	res  *outcome.Result[*Report]
	r    *Report // res.Report
	// held: the table locks this transaction holds ("schema.table" to its
	// LOCK TABLE mode), taken in the documented order (tableLocks).
	held map[string]string
}

// fail is err, and o the run's outcome when err is not nil: a refusal, a
// lock not obtained, a check without an answer.
func (s *runner) fail(o outcome.Outcome, err error) error {
	if err != nil {
		s.res.Outcome = o
	}
	return err
}

func (s *runner) step(name, detail string, fn func() error) error {
	if s.opts.Hooks.BeforeStep != nil {
		if err := s.opts.Hooks.BeforeStep(s.ctx, s.r.BackendPID, name); err != nil {
			return fmt.Errorf("test hook before %s: %w", name, err)
		}
	}
	if s.opts.Progress != nil {
		s.opts.Progress(Event{Step: name, Detail: detail})
	}
	t := time.Now()
	err := fn()
	el := time.Since(t)
	s.r.Steps = append(s.r.Steps, StepTiming{Step: name, DurationMS: el.Milliseconds(), Detail: detail})
	if s.opts.Progress != nil {
		s.opts.Progress(Event{Step: name, Done: true, Detail: detail, Elapsed: el})
	}
	return err
}

// apply runs Apply's plan (applyPlan, plan.go) on one transaction. The
// first error stops it; the transaction is then rolled back.
func apply(ctx context.Context, conn *pgx.Conn, opts Options, res *outcome.Result[*Report]) (err error) {
	a := &applyRun{runner: &runner{ctx: ctx, opts: opts, res: res, r: res.Report}, conn: conn}
	defer func() {
		// After the rollback (below): what was built before the
		// transaction goes with a failed or dry run.
		if err != nil || opts.DryRun {
			err = joinCleanup(err, a.dropPrebuilt())
		} else {
			err = joinCleanup(err, a.dropUnusedCheck())
		}
		err = joinCleanup(err, a.releasePrebuild())
	}()
	defer func() { err = joinCleanup(err, a.closeScope()) }()
	defer a.rollbackUnlessDone()
	for _, st := range applyPlan {
		if a.done {
			return nil
		}
		if st.when != nil && !st.when(a) {
			continue
		}
		run := func() error { return st.run(a) }
		if st.name != "" {
			run = func() error { return a.step(st.name, st.detail(a), func() error { return st.run(a) }) }
		}
		if err := run(); err != nil {
			return err
		}
	}
	return nil
}

// applyRun is one run of apply: its transaction and what its steps hand on
// to the next ones.
type applyRun struct {
	*runner
	conn          *pgx.Conn
	all           []migrations.Migration // the embedded migrations
	ledger        *supabaseFile          // the user's copy of upstream's migration, if asked
	target        versions.Release       // where the plan goes (Options.To)
	copy          *pgflowfiles.Copy      // the user's copy of upstream's files, if found
	copyErr       error                  // why the copy given cannot serve (a file missing or altered)
	plan          *Plan                  // the hops, made by admit
	preflightRan  bool                   // the shared check catalog ran (before the own hop)
	hopPGMQ       *pgmqver.Found         // pgmq as the checks see it, read once before the table locks (pgmqBeforeLocks)
	pre           *prebuilt              // built before the transaction (prebuild.go)
	sessionLocked bool                   // prebuild holds the advisory lock at session level
	tx            pgx.Tx
	accepted      bool      // admit accepted a state AcceptState vouched for
	done          bool      // admit found nothing to do: already upgraded
	lockHeld      time.Time // when the table locks were granted
	committed     bool      // committed, or rolled back on purpose (dry run)
	pgmq          *pgmqHop  // apply --pgmq (pgmqhop.go)
	pgmqOnly      bool      // pgflow has no hop to run: the pgmq hop alone
	// wholeAfterCommit: the release reached was checked by its scope under
	// the locks; the whole catalog is read after the commit (reached.go).
	wholeAfterCommit bool
	early            *early  // what ran before the table locks (early.go)
	scope            *scoped // the post-conditions' scope, when they read it alone (reached.go)
}

// integrity checks the embedded migrations against atlas.sum and finds the
// user's copy of upstream's migration.
func (a *applyRun) integrity() error {
	opts := a.opts
	if err := opts.Verify(); err != nil {
		return a.fail(outcome.Refused, fmt.Errorf("%w: %w", ErrIntegrity, err))
	}
	if opts.PGMQ != "" {
		target, err := parsePGMQTarget(opts.PGMQ)
		if err != nil {
			return a.fail(outcome.Refused, err)
		}
		a.pgmq = &pgmqHop{target: target, r: &PGMQReport{To: target.String()}}
		a.r.PGMQ = a.pgmq.r
	}
	var err error
	if a.all, err = opts.Migrations(); err != nil {
		return err
	}
	if a.target, err = resolveTarget(opts.To); err != nil {
		return a.fail(outcome.Refused, err)
	}
	// The user's copy of upstream's files and of upstream's migration,
	// found before anything is locked: a wrong folder is a refusal that
	// changes nothing.
	a.findCopy()
	// Upstream's 0.17.0 file found by content is recorded as push would
	// (recordOwnInLedger); otherwise the Supabase folder must hold it by
	// name, as before.
	byContent := a.copy != nil && a.copyErr == nil && len(a.copy.Files) >= ownHopFile
	if !byContent && opts.SupabaseDir != "" {
		if a.ledger, err = findSupabaseMigration(opts.SupabaseDir); err != nil {
			return a.fail(outcome.Refused, err)
		}
	}
	return nil
}

// begin opens the upgrade transaction.
func (a *applyRun) begin() error {
	var err error
	a.tx, err = a.conn.Begin(a.ctx)
	if err != nil {
		return fmt.Errorf("beginning the upgrade transaction: %w", err)
	}
	return nil
}

// rollbackUnlessDone rolls the transaction back unless it was committed (or
// rolled back on purpose), and then records how long the tables were locked.
func (a *applyRun) rollbackUnlessDone() {
	if a.tx == nil || a.committed {
		return // not begun, or done with
	}
	// A cancelled ctx must not stop the rollback.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 10*time.Second)
	defer cancel()
	_ = a.tx.Rollback(rctx)
	if !a.lockHeld.IsZero() && a.r.LockWindowMS == 0 {
		a.r.LockWindowMS = time.Since(a.lockHeld).Milliseconds()
	}
}

// advisoryLock takes the upgrade's advisory lock, then bounds every later
// lock wait of the transaction.
func (a *applyRun) advisoryLock() error {
	ctx, tx, opts := a.ctx, a.tx, a.opts
	if err := acquireAdvisoryLock(ctx, tx, opts.Wait); err != nil {
		if errors.Is(err, ErrUpgradeLocked) {
			return a.fail(outcome.LockBusy, err)
		}
		return err
	}
	// Only now, with the advisory lock held: every later lock wait of
	// this transaction is bounded. The limits end with the transaction,
	// so they are safe through a pooler.
	if err := (session.Limits{Lock: opts.LockTimeout, IdleInTransaction: idleTimeout}).Set(ctx, tx); err != nil {
		return fmt.Errorf("setting lock_timeout: %w", err)
	}
	return nil
}

// privileges refuses, before any table lock, a role that cannot upgrade.
func (a *applyRun) privileges() error {
	f, err := preflight.Privileges(a.ctx, a.tx, -1)
	if err != nil {
		return err
	}
	if len(f) > 0 {
		a.r.Blockers = f
		return a.fail(outcome.Refused, fmt.Errorf("%w: %s", outcome.ErrPreflight, f[0].Message))
	}
	return nil
}

// tableLocks takes LockPlan's table locks, retried with backoff.
func (a *applyRun) tableLocks() error {
	ctx, tx, opts, r := a.ctx, a.tx, a.opts, a.r
	res, err := lockTables(ctx, tx, a.lockPlan(), opts.LockTimeout, opts.LockRetries, func(detail string) {
		if opts.Progress != nil {
			opts.Progress(Event{Step: StepTableLocks, Detail: detail})
		}
	})
	r.LockAttempts, r.LockWaitMS, r.AutovacuumCancelled = res.Attempts, res.Waited.Milliseconds(), res.Autovacuum
	if err != nil {
		var tle *TableLockError
		if errors.As(err, &tle) {
			return a.fail(outcome.LockBusy, err)
		}
		return err
	}
	a.lockHeld = res.Held
	a.held = map[string]string{}
	for _, l := range a.lockPlan() {
		a.held[l.Name()] = l.Mode
	}
	return nil
}

// runPreflight runs the shared check catalog, exact, under the locks.
func (a *applyRun) runPreflight() error {
	opts, r := a.opts, a.r
	a.preflightRan = true
	popts := opts.Preflight
	if len(popts.Checks) == 0 {
		popts.Checks = preflightChecks()
	}
	if a.pgmqActive() {
		// The pgmq hop in this transaction takes pgmq past what this check
		// blocks on (1.10.0/1.10.1), and checks the claim path itself.
		popts.Checks = slices.DeleteFunc(slices.Clone(popts.Checks), func(id string) bool { return id == "pgmq.claim_path" })
	}
	if a.accepted {
		// The state AcceptState vouched for, read in this transaction;
		// the file's guard checks the shape again under the locks.
		popts.Schema = &r.State
	}
	if popts.PGMQ == nil {
		popts.PGMQ = a.hopPGMQ
	}
	res, err := preflight.Run(a.ctx, a.tx, popts)
	r.Preflight = res.Checks
	if err != nil {
		return err
	}
	if !res.OK() {
		r.Blockers = res.Blockers()
		return a.fail(outcome.FromPreflight(res))
	}
	return nil
}

// pgmqBeforeLocks reads which pgmq is installed, for the preflight and the
// hops' checks under the locks: its version is no table's, and reading it
// (pg_available_extension_versions reads the server's extension files)
// under the locks would keep the application waiting for it.
func (a *applyRun) pgmqBeforeLocks() error {
	p, err := pgmqver.Detect(a.ctx, a.tx)
	if err != nil {
		return err
	}
	a.hopPGMQ = &p
	return nil
}

// migrate runs the pending migrations, one step each.
func (a *applyRun) migrate() error {
	for _, m := range a.all {
		if !slices.Contains(a.r.Pending, m.Version+"_"+m.Name) {
			continue
		}
		if err := a.step(StepMigrate, m.File, func() error { return a.runMigration(a.tx, m, !a.accepted) }); err != nil {
			return err
		}
	}
	return nil
}

// postChecks runs the post-conditions (Checks) in the transaction: on
// the objects the plan changes alone when the start catalog allows it
// (reached.go), else on the whole catalog, read once for the 0.17
// comparison and the release reached. The tables are locked meanwhile.
func (a *applyRun) postChecks() error {
	var out []CheckOutcome
	var err error
	if a.scope != nil {
		out, err = a.scopedPostConditions(a.scope)
	} else {
		out, err = a.wholePostConditions(a.tx, true)
	}
	a.r.PostConditions = out
	if err != nil {
		return err
	}
	if bad := Failed(out); len(bad) > 0 {
		ids := make([]string, len(bad))
		for i, b := range bad {
			ids[i] = b.ID + ": " + b.Detail
		}
		return a.fail(outcome.Refused, fmt.Errorf("%w: %s", ErrPostConditions, strings.Join(ids, "; ")))
	}
	return nil
}

// beforeCommit runs Options.BeforeCommit, when set.
func (a *applyRun) beforeCommit() error {
	if a.opts.BeforeCommit != nil {
		return a.opts.BeforeCommit(a.ctx, a.tx)
	}
	return nil
}

// record records the applied revisions, and the migration in Supabase's
// ledger when asked.
func (a *applyRun) record() error {
	ctx, tx, r := a.ctx, a.tx, a.r
	for _, m := range a.all {
		if slices.Contains(r.Pending, m.Version+"_"+m.Name) {
			if err := recordRevision(ctx, tx, m); err != nil {
				return err
			}
		}
	}
	ok, why, err := a.recordOwnInLedger()
	if err != nil {
		return err
	}
	if !ok && a.plan.Has(HopOwn) {
		ok, why, err = recordSupabase(ctx, tx, a.ledger)
		if err != nil {
			return err
		}
	}
	r.SupabaseRecorded, r.Supabase = ok, why
	return nil
}

// commit commits the upgrade.
func (a *applyRun) commit() error {
	if err := a.tx.Commit(a.ctx); err != nil {
		return fmt.Errorf("committing the upgrade (nothing was changed unless the server reports otherwise): %w", err)
	}
	a.committed = true
	a.windowEnds()
	return nil
}

// windowEnds records the lock window when the commit (or the rollback of a
// dry run) has released the locks: what runs after it (the whole catalog
// read again, pgmq's claim path) locks the application out of nothing.
func (a *applyRun) windowEnds() {
	if !a.lockHeld.IsZero() {
		a.r.LockWindowMS = time.Since(a.lockHeld).Milliseconds()
	}
}

// rollbackDryRun rolls a dry run back on purpose.
func (a *applyRun) rollbackDryRun() error {
	if err := a.tx.Rollback(a.ctx); err != nil {
		return fmt.Errorf("rolling back the dry run: %w", err)
	}
	a.committed = true // rolled back on purpose
	a.windowEnds()
	return nil
}

// finish writes the outcome of a run that committed (or rolled back on
// purpose) into the report.
func (a *applyRun) finish() error {
	r := a.r
	window := time.Duration(r.LockWindowMS) * time.Millisecond
	switch {
	case a.opts.DryRun && a.pgmqOnly:
		a.res.Outcome = outcome.DryRun
		a.res.Message = fmt.Sprintf("dry run: %s, then rolled back; tables were locked for %s", a.pgmq.message(true), window)
	case a.opts.DryRun:
		a.res.Outcome = outcome.DryRun
		a.res.Message = fmt.Sprintf("dry run: the migration ran and passed its post-conditions, then was rolled back; tables were locked for %s", window)
		if a.pgmq != nil {
			a.res.Message = strings.Replace(a.res.Message, "then was rolled back", "then "+a.pgmq.message(true)+", then all was rolled back", 1)
		}
	case a.pgmqOnly:
		a.res.Outcome = outcome.Applied
		a.res.Message = fmt.Sprintf("pgflow already %s; %s; tables were locked for %s", a.plan.Reached, a.pgmq.message(false), window)
	default:
		a.res.Outcome = outcome.Applied
		// The post-conditions passed in the committed transaction: the
		// catalog is the reached release's.
		r.VersionNow, r.NextStep = a.plan.Reached, AppliedNextStep
		applied := append(append([]string(nil), r.Pending...), r.HopsApplied...)
		if len(applied) == 0 {
			applied = []string{"no migration"}
		}
		a.res.Message = fmt.Sprintf("upgraded to pgflow %s: %s applied; tables were locked for %s", a.plan.Reached, strings.Join(applied, ", "), window)
		if a.pgmq != nil {
			a.res.Message += "; " + a.pgmq.message(false)
		}
		if r.Telemetry != "" {
			a.res.Message += "; " + r.Telemetry
		} else if a.plan.Telemetry != "" {
			a.res.Message += "; " + a.plan.Telemetry
		}
		if a.plan.Rest != "" {
			a.res.Message += "; not at upstream's newest release: " + a.plan.Rest
			r.NextStep = AppliedNextStep + "; then " + a.plan.Rest
		}
	}
	return nil
}

// readState reads the schema state and the revisions this tool recorded,
// with r.Pending the migrations not recorded.
func (a *applyRun) readState() error {
	ctx, r, tx, all := a.ctx, a.r, a.tx, a.all
	st, err := versions.DetectSchema(ctx, tx)
	if err != nil {
		return err
	}
	r.State, r.PgflowVersion = st, st.Version
	applied, err := appliedVersions(ctx, tx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, m := range all {
		known[m.Version] = true
		if !applied[m.Version] {
			r.Pending = append(r.Pending, m.Version+"_"+m.Name)
		}
	}
	for v := range applied {
		if !known[v] {
			r.Unknown = append(r.Unknown, v)
		}
	}
	sort.Strings(r.Unknown)
	return nil
}

// admit decides whether apply goes on: from 0.16.0 (or a state AcceptState
// vouches for: then a.accepted), with r.Pending the migrations to run.
// a.done says there is nothing to do (already 0.17.0, whoever applied it);
// an error refuses every other state, naming the version found and the
// next step (internal/versions).
func (a *applyRun) admit() error {
	ctx, r, tx, all := a.ctx, a.r, a.tx, a.all
	var accepted bool
	if q := r.State.Version; q != nil && q.Quiesce != nil && !a.opts.quiesced {
		return a.fail(outcome.Refused, quiesceRefusal(q.Quiesce)) // inprogress.go
	}
	if len(r.Unknown) > 0 {
		// A revision we do not ship: a newer tool upgraded this database
		// further, and this one must not "re-apply" or touch it.
		return a.fail(outcome.Refused, fmt.Errorf("%w: pgflow_upgrade.schema_revisions records %s, which this pgflow-upgrade (migrations up to %s) does not know; use the newer pgflow-upgrade that applied it (`pgflow-upgrade status` lists the revisions)",
			ErrNewerSchema, strings.Join(r.Unknown, ", "), Version))
	}
	if a.opts.AcceptState != nil && r.State.State != versions.SchemaBaseline && r.State.State != versions.SchemaUpgraded {
		ok, err := a.opts.AcceptState(ctx, tx, r.State)
		if err != nil {
			return err
		}
		accepted = ok
	}
	// The plan: from the release found (the shape an online upgrade
	// prepared counts as 0.16.0) to the one asked for.
	from := -1
	switch v := r.State.Version; {
	case accepted:
		from = ownHopFile - 1
	case v != nil && v.Release != nil && v.Online == nil &&
		(r.State.State == versions.SchemaUpgraded || r.State.State == versions.SchemaBaseline || r.State.State == versions.SchemaOlder):
		from = v.Release.Files
	}
	if from >= 0 {
		if err := a.planHops(from); err != nil {
			return err
		}
		if len(a.plan.Hops) == 0 && (from >= ownHopFile || from >= a.target.Files) && !(a.opts.TelemetryOff && from >= 26) {
			if a.pgmq != nil {
				// pgflow is where its hops go: the pgmq hop alone.
				a.pgmqOnly, r.Pending = true, nil
				return nil
			}
			return a.alreadyThere(from)
		}
		switch {
		case a.plan.Has(HopOwn):
			if len(r.Pending) == 0 {
				for _, m := range all {
					r.Pending = append(r.Pending, m.Version+"_"+m.Name)
				}
			}
			a.accepted = accepted
			return nil
		case len(a.plan.Hops) > 0 || from >= ownHopFile:
			r.Pending = nil
			return nil
		}
	}
	switch {
	case r.State.State == versions.SchemaBaseline || accepted:
		// The one state this migration starts from (or one AcceptState vouches for).
		if len(r.Pending) == 0 {
			for _, m := range all {
				r.Pending = append(r.Pending, m.Version+"_"+m.Name)
			}
		}
	case r.State.Version != nil && r.State.Version.Online != nil:
		return a.fail(outcome.Refused, onlineRefusal(r.State.Version)) // inprogress.go
	case r.State.Version.PlanStarts() && a.plan != nil && a.plan.Rest != "":
		// On the road, but upstream's files are not at hand: say what the
		// plan needs, once.
		return a.fail(outcome.Refused, fmt.Errorf("%w: pgflow %s: %s", ErrNoUpstreamFiles, r.State.Version.Release.Name, a.plan.Rest))
	default:
		// Name the version found and the next step (internal/versions).
		why := strings.Join(r.State.Differences, "; ")
		if v := r.State.Version; v != nil {
			why = v.Summary() + ": " + v.NextStep
			if len(r.State.Differences) > 0 {
				why += ": " + strings.Join(r.State.Differences, "; ")
			}
		}
		if a.plan != nil && a.plan.Rest != "" {
			why += "; " + a.plan.Rest
		}
		return a.fail(outcome.Refused, fmt.Errorf("%w: state %s (%s); run `pgflow-upgrade status`", ErrNotBaseline, r.State.State, why))
	}
	a.accepted = accepted
	return nil
}

// alreadyThere ends a run whose plan has nothing to do: the database is
// at the release asked for (or at the furthest this apply can take it
// without upstream's files: the report says what the rest needs).
// 0.17.0 is 0.17.0, whoever applied it: this tool (the revision is
// recorded) or pgflow's own migration 20260915074120 (it is not).
func (a *applyRun) alreadyThere(from int) error {
	r := a.r
	ours := !slices.Contains(r.Pending, Version+"_"+Name)
	r.Pending = nil
	a.res.Outcome = outcome.AlreadyApplied
	found := versions.StateName(from)
	if ours {
		a.res.Message = "already upgraded: pgflow " + found + ", revision " + Version + " (" + Name + ") recorded in pgflow_upgrade.schema_revisions; nothing to do"
	} else {
		a.res.Message = "already upgraded: pgflow " + found + " (not applied by this tool: e.g. by pgflow's own migration " + UpstreamVersion + "); nothing to do"
	}
	if a.plan.Rest != "" {
		a.res.Message = strings.TrimSuffix(a.res.Message, "; nothing to do") + "; nothing to do without upstream's files: " + a.plan.Rest
	} else if from > a.target.Files {
		a.res.Message += " (past --to " + a.target.Name + ")"
	}
	a.done = true
	return nil
}

// AppliedNextStep is what to do after a successful apply.
const AppliedNextStep = "run `pgflow-upgrade verify`, then deploy the 0.17 workers (stop the 0.16.0 ones)"

// lockPlanText: "pgflow.flows, pgflow.steps [access exclusive] ->
// pgflow.deps, ... [exclusive] -> ...", consecutive tables of one mode
// grouped.
func lockPlanText(plan []TableLock) string {
	var parts []string
	for i := 0; i < len(plan); {
		j := i
		var names []string
		for ; j < len(plan) && plan[j].Mode == plan[i].Mode; j++ {
			names = append(names, plan[j].Name())
		}
		parts = append(parts, strings.Join(names, ", ")+" ["+plan[i].Mode+"]")
		i = j
	}
	return strings.Join(parts, " -> ")
}
