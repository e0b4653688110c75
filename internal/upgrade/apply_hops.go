package upgrade

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// StepHop is the step of one upstream hop (its file); StepTelemetry the
// opt-out of --telemetry=off.
const (
	StepHop       = "hop"
	StepTelemetry = "telemetry_off"
)

// ErrTarget: --to names a release this apply cannot end at.
var ErrTarget = errors.New("not a release apply can upgrade to")

// resolveTarget reads Options.To (default upstream's newest). The CLI
// accepts 0.17.0 and later; apply --online asks for 0.16.0 first from an
// older release (its phases start there).
func resolveTarget(to string) (versions.Release, error) {
	if to == "" {
		to = versions.Newest
	}
	r, err := versions.LookupRelease(to)
	if err != nil {
		return r, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	return r, nil
}

// findCopy looks for the user's copy of upstream's files, before anything
// is locked: Options.PgflowMigrations, else the Supabase folder. A folder
// given as --pgflow-migrations must hold them; the Supabase folder may
// hold none (then the plan stops where this tool's own hops end).
func (a *applyRun) findCopy() {
	dir, explicit := a.opts.PgflowMigrations, true
	if dir == "" {
		dir, explicit = a.opts.SupabaseDir, false
	}
	if dir == "" {
		return
	}
	a.copy, a.copyErr = pgflowfiles.Find(dir, a.target.Files)
	if !explicit && errors.Is(a.copyErr, pgflowfiles.ErrNoCopy) {
		a.copyErr = nil // not at hand: said in the plan's Rest
	}
}

// planHops makes the plan from the release detected to the target, and
// refuses one that cannot start (a ledger that is not a prefix, a copy
// with a missing or altered file the plan needs).
func (a *applyRun) planHops(from int) error {
	r := a.r
	if rel := r.State.Version; rel != nil && rel.Release != nil {
		if why := rel.Release.Refusal(); why != "" {
			return a.fail(outcome.Refused, fmt.Errorf("%w: %s", ErrNotBaseline, why))
		}
	}
	copy := a.copy
	if a.copyErr != nil {
		copy = nil
	}
	a.plan = MakePlan(from, a.target, copy, a.opts.TelemetryOff)
	r.Plan = a.plan
	if a.copyErr != nil && a.plan.Rest != "" {
		// The rest needs the files, and the copy given lacks one (or
		// changed one): name it, change nothing.
		return a.fail(outcome.Refused, a.copyErr)
	}
	return nil
}

// runHops runs the plan's hops, each a step, in the transaction.
func (a *applyRun) runHops() error {
	for _, h := range a.plan.Hops {
		var err error
		switch h.Kind {
		case HopOwn:
			err = a.ownHop()
		case HopUpstream:
			err = a.step(StepHop, h.File, func() error { return a.upstreamHop(h) })
		default:
			err = fmt.Errorf("hop %s -> %s: unknown kind %q", h.From, h.To, h.Kind)
		}
		if err != nil {
			return err
		}
	}
	if a.opts.TelemetryOff && a.plan.ReachedFiles >= 26 {
		return a.step(StepTelemetry, "pgflow_telemetry.disable()", a.telemetryOff)
	}
	return nil
}

// ownHop is this tool's migration: the preflight of the shared check
// catalog first when the plan started before 0.16.0 (it reads a 0.16.0
// schema, reached only now), then the pending migrations.
func (a *applyRun) ownHop() error {
	if !a.preflightRan {
		if err := a.step(StepPreflight, "the shared check catalog, exact, under the locks (before the 0.16.0 -> 0.17.0 hop)", a.runPreflight); err != nil {
			return err
		}
	}
	return a.migrate()
}

// upstreamHop runs one of upstream's files from the user's copy, statement
// by statement (timed, reported), after its own checks, and records it in
// the Supabase ledger as push would, in the same transaction.
func (a *applyRun) upstreamHop(h Hop) error {
	if err := a.hopChecks(h, audit.UnderLocks, a.tx); err != nil {
		return err
	}
	file, err := a.upstreamText(h)
	if err != nil {
		return err
	}
	sql, stmts := file.sql, file.stmts
	for i, st := range stmts {
		if a.early.ran(h.Upstream.Index, i) {
			continue // before the table locks (early.go)
		}
		if isTxControl(st) {
			return fmt.Errorf("%s statement %d is transaction control (%q): apply runs the file in its own transaction", h.File, i+1, summary(st))
		}
		sum := summary(st)
		if a.opts.Progress != nil {
			a.opts.Progress(Event{Step: StepHop, Detail: fmt.Sprintf("%s [%d/%d] %s", h.File, i+1, len(stmts), sum)})
		}
		run := []string{st}
		with, instead, err := a.insteadOf(h.Upstream.Index, i, st)
		if err != nil {
			return err
		}
		if instead {
			// Built before the transaction (prebuild.go): found done, or
			// finished by a short swap.
			run, sum = with, insteadLabel(st, with)+sum
		}
		t := time.Now()
		var rows int64
		for _, s := range run {
			tag, err := a.tx.Exec(a.ctx, s)
			if err != nil {
				return fmt.Errorf("upstream's %s (from %s) statement %d (%s): %w", h.File, h.Path, i+1, summary(s), err)
			}
			rows += tag.RowsAffected()
		}
		took := time.Since(t)
		a.r.Statements = append(a.r.Statements, StatementReport{Migration: h.Upstream.Version(), Index: i + 1, Summary: sum,
			DurationMS: took.Milliseconds(), DurationUS: took.Microseconds(), Rows: rows})
	}
	if !a.early.recorded(h.Upstream.Index) {
		if err := a.recordHop(h, sql); err != nil {
			return err
		}
	}
	a.r.HopsApplied = append(a.r.HopsApplied, h.File)
	return nil
}

// recordHop records the hop's file in the Supabase ledger as push would.
func (a *applyRun) recordHop(h Hop, sql string) error {
	version, name, ok := ledgerOf(h.Path)
	if !ok {
		version, name = h.Upstream.Version(), h.Upstream.Title()
	}
	_, err := pgflowfiles.RecordApplied(a.ctx, a.tx, version, name, sql)
	return err
}

// hopChecks runs the catalog's checks declared for hop h at moment m
// (audit.RunPreflight) in tx: under the locks right before the hop's file,
// and (BeforeLocks) before anything is built for it. What makes the file
// fail is found first and refused with counts.
func (a *applyRun) hopChecks(h Hop, m audit.Moment, tx pgx.Tx) error {
	hop := audit.HopFile(h.Upstream.Index)
	if len(audit.For(m, hop)) == 0 {
		return nil
	}
	popts := a.opts.Preflight
	popts.Checks, popts.Extra, popts.Hop, popts.At = nil, nil, hop, m
	if m == audit.UnderLocks {
		// Under the locks, the facts this transaction read already (the
		// state when it began: pgflow's tables are there; pgmq, read once)
		// instead of two catalog reads more per hop.
		if a.hopPGMQ == nil {
			p, err := pgmqver.Detect(a.ctx, tx)
			if err != nil {
				return fmt.Errorf("checking before %s: %w", h.File, err)
			}
			a.hopPGMQ = &p
		}
		popts.Schema, popts.PGMQ = &a.r.State, a.hopPGMQ
	}
	res, err := audit.RunPreflight(a.ctx, tx, popts)
	if err != nil {
		return fmt.Errorf("checking before %s: %w", h.File, err)
	}
	for _, r := range res {
		if r.Status == audit.StatusError {
			return fmt.Errorf("checking before %s: %s: %w", h.File, r.ID, r.Err)
		}
	}
	for _, r := range res {
		var bad int64
		var blockers []audit.Finding
		for _, f := range r.Findings {
			if f.Severity == audit.Blocker {
				bad += f.Count
				blockers = append(blockers, f)
			}
		}
		if len(blockers) > 0 {
			a.r.Blockers = blockers
			return a.fail(outcome.Refused, fmt.Errorf("%w: before upstream's %s: %d missing or failing: %s", outcome.ErrPreflight, h.File, bad, r.Title))
		}
	}
	if pr := (preflight.Result{Checks: res}); pr.Inconclusive() {
		return a.fail(outcome.Inconclusive, fmt.Errorf("%w: before upstream's %s: %s", outcome.ErrInconclusive, h.File, pr.Summary()))
	}
	return nil
}

// hopChecksBeforeLocks runs hop h's checks declared BeforeLocks, in a
// read-only transaction of their own before apply's: what would make
// building its statements beforehand fail (a row its new CHECK rejects
// fails the validation) is refused with counts instead.
func (a *applyRun) hopChecksBeforeLocks(h Hop) error {
	if len(audit.For(audit.BeforeLocks, audit.HopFile(h.Upstream.Index))) == 0 {
		return nil
	}
	timeout := a.opts.Preflight.CheckTimeout
	if timeout <= 0 {
		timeout = time.Minute // the audit's default per check
	}
	tx, err := session.BeginReadOnly(a.ctx, a.conn, timeout, a.opts.LockTimeout, "pgflow-upgrade apply")
	if err != nil {
		return fmt.Errorf("checking before %s: %w", h.File, err)
	}
	defer tx.Rollback(context.WithoutCancel(a.ctx))
	return a.hopChecks(h, audit.BeforeLocks, tx)
}

// telemetryOff opts out through upstream's own function, in the
// transaction: no pgflow_telemetry_report job is left.
func (a *applyRun) telemetryOff() error {
	if _, err := a.tx.Exec(a.ctx, `select pgflow_telemetry.disable()`); err != nil {
		return fmt.Errorf("opting out of pgflow's telemetry (pgflow_telemetry.disable()): %w", err)
	}
	a.r.Telemetry = TelemetryNote(26, true)
	return nil
}

// recordOwnInLedger records our hop as upstream's file 24 in the Supabase
// ledger under the user's copy's name, as push would; false when the copy
// is not at hand (recordSupabase then does what it always did).
func (a *applyRun) recordOwnInLedger() (bool, string, error) {
	if a.copy == nil || a.copyErr != nil || len(a.copy.Files) < ownHopFile || !a.plan.Has(HopOwn) {
		return false, "", nil
	}
	f := a.copy.File(ownHopFile)
	sql, err := a.copy.Read(ownHopFile)
	if err != nil {
		return false, "", err
	}
	version, name, ok := ledgerOf(f.Path)
	if !ok {
		version, name = f.Version(), f.Title()
	}
	rec, err := pgflowfiles.RecordApplied(a.ctx, a.tx, version, name, sql)
	if err != nil {
		return false, "", err
	}
	if !rec {
		return true, "supabase_migrations.schema_migrations already had " + version, nil
	}
	return true, "recorded " + version + "_" + name + " (upstream's " + f.Name + ", replaced by this tool's migration) as applied in supabase_migrations.schema_migrations", nil
}

// preflightFirst: the shared check catalog runs right after the locks when
// the plan starts with this tool's own hop (from 0.16.0, or the shape an
// online upgrade prepared); a plan from an older release runs it before
// that hop (ownHop), one without it runs each hop's own checks instead.
func (a *applyRun) preflightFirst() bool {
	return len(a.plan.Hops) > 0 && a.plan.Hops[0].Kind == HopOwn
}

// upstreamFile is one of upstream's files of the plan: its text, verified
// against its atlas.sum hash, and its statements.
type upstreamFile struct {
	sql   string
	stmts []string
}

// upstreamText reads and verifies hop h's file once per run: the prebuild,
// the look before the table locks and the hop itself each walk its
// statements, and verifying it re-reads and hashes every file before it.
// What runs is the text verified first. A missing or altered file refuses
// the run.
func (a *applyRun) upstreamText(h Hop) (upstreamFile, error) {
	if f, ok := a.files[h.Upstream.Index]; ok {
		return f, nil
	}
	sql, err := a.copy.Read(h.Upstream.Index)
	if err != nil {
		return upstreamFile{}, a.fail(outcome.Refused, err)
	}
	stmts, err := pgflowfiles.Statements(sql)
	if err != nil {
		return upstreamFile{}, fmt.Errorf("%s: %w", h.Path, err)
	}
	if a.files == nil {
		a.files = map[int]upstreamFile{}
	}
	f := upstreamFile{sql: sql, stmts: stmts}
	a.files[h.Upstream.Index] = f
	return f, nil
}
