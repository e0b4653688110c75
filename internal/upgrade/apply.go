package upgrade

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
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
	files         map[int]upstreamFile   // upstream's files of the plan, read and verified once (upstreamText)
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
