package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Status of one check's run.
type Status string

const (
	StatusOK           Status = "ok"           // ran, found nothing
	StatusFindings     Status = "findings"     // ran, found something
	StatusInconclusive Status = "inconclusive" // ran out of time (statement or lock timeout, or its budget)
	StatusError        Status = "error"        // failed for another reason (e.g. permission denied)
	StatusSkipped      Status = "skipped"      // what it needs is absent (no pgflow tables, no pgmq)
)

// CheckResult is the outcome of one check.
type CheckResult struct {
	ID         string    `json:"id"`
	Title      string    `json:"title"`
	Severity   Severity  `json:"severity"`
	Status     Status    `json:"status"`
	Findings   []Finding `json:"findings"`
	DurationMS int64     `json:"duration_ms"`
	// Error says why the check is inconclusive, errored or skipped. It keeps
	// the SQLSTATE when there is one. Err is the Go error (not in JSON).
	Error string `json:"error,omitempty"`
	Err   error  `json:"-"`
	// Coverage: how much of its table a check that stopped part-way had
	// decided ("examined N of about M rows"); only with inconclusive/error.
	Coverage *Coverage `json:"coverage,omitempty"`
}

// Report is the result of an audit.
type Report struct {
	ServerVersion string              `json:"server_version"`
	Database      string              `json:"database"`
	PGMQ          pgmqver.Found       `json:"pgmq"`
	Schema        versions.SchemaInfo `json:"schema"`
	// PgflowVersion: which pgflow was found and the next step (the same
	// object status and apply print).
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	Mode          string              `json:"mode"`
	Sample        int                 `json:"sample"`
	Bound         int64               `json:"bound"`
	Checks        []CheckResult       `json:"checks"`
	Started       time.Time           `json:"started_at"`
	DurationMS    int64               `json:"duration_ms"`
}

// Counts of a report.
func (r *Report) Blockers() int     { return countSeverity(r.Checks, Blocker) }
func (r *Report) Inconclusive() int { return countStatus(r.Checks, StatusInconclusive) }
func (r *Report) Errors() int       { return countStatus(r.Checks, StatusError) }

// Blockers counts blocker findings in results (apply refuses when > 0).
func Blockers(results []CheckResult) int { return countSeverity(results, Blocker) }

func countSeverity(results []CheckResult, s Severity) int {
	n := 0
	for _, r := range results {
		for _, f := range r.Findings {
			if f.Severity == s {
				n++
			}
		}
	}
	return n
}

func countStatus(results []CheckResult, s Status) int {
	n := 0
	for _, r := range results {
		if r.Status == s {
			n++
		}
	}
	return n
}

// Options of a run. Zero values take the defaults.
type Options struct {
	Sample int // sample rows per finding (default 5; negative: none)
	// Checks: the IDs of the checks to run. Default: the checks declared
	// for the runner's moment (InAudit: Run; UnderLocks: RunPreflight) and
	// for Hop.
	Checks []string
	// Hop selects a hop's own checks (RunPreflight, apply right before
	// that hop); EveryPlan (the default) the checks of every plan.
	Hop HopFile
	// At is the moment of the caller's transaction (RunPreflight):
	// UnderLocks (the default) or BeforeLocks.
	At Moment
	// Bound: the rows one query of a chunked scan looks at (default
	// 500,000). It sets the granularity of "examined N" when a check runs
	// out of time; it never limits a count.
	Bound        int64
	CheckTimeout time.Duration // per check (default 60s)
	TotalTimeout time.Duration // whole audit (default 180s); ignored by RunPreflight
	LockTimeout  time.Duration // lock_timeout of each check (default 1s)
	// ApplicationName for SET LOCAL application_name (default "pgflow-upgrade audit").
	ApplicationName string
	// Extra checks appended to the selection (tests, extensions).
	Extra []Check
	// Session thresholds of sessions.long_transactions (default 30s / 10s).
	LongTransaction, IdleInTransaction time.Duration
	// LiveWorker: heartbeat age under which a worker counts as alive
	// (workers.legacy_alive; default 1 minute).
	LiveWorker time.Duration
	// Schema, if set, is the schema state RunPreflight gives the checks
	// instead of reading it again (a catalog read of ~10 ms): the caller
	// detected it in the same transaction (apply --online's switch, whose
	// prepared shape the migration's guard checks again under the locks).
	Schema *versions.SchemaInfo
	// PGMQ, if set, is the pgmq RunPreflight gives the checks instead of
	// reading it again (it reads the server's extension versions): the
	// caller detected it in the same transaction, under the same locks.
	PGMQ *pgmqver.Found
}

const (
	defaultSample = 5
	// defaultBound: a range of the duplicate scan, sorted in its 64MB
	// work_mem (BENCHMARKS.md, "audit at 5M").
	defaultBound = 500_000
	// defaultCheckTimeout: the exact duplicate scan of 5M step_tasks rows
	// took 13-26 s on a 2-core machine at load 10-15 (a few seconds when
	// quiet; BENCHMARKS.md, "audit at 5M"): 60 s answers there with room.
	defaultCheckTimeout = 60 * time.Second
	defaultTotalTimeout = 180 * time.Second
	defaultLockTimeout  = time.Second
)

func (o Options) withDefaults() Options {
	if o.Sample == 0 {
		o.Sample = defaultSample
	}
	if o.Sample < 0 {
		o.Sample = 0
	}
	if o.Bound <= 0 {
		o.Bound = defaultBound
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = defaultCheckTimeout
	}
	if o.TotalTimeout <= 0 {
		o.TotalTimeout = defaultTotalTimeout
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockTimeout
	}
	if o.LongTransaction <= 0 {
		o.LongTransaction = 30 * time.Second
	}
	if o.IdleInTransaction <= 0 {
		o.IdleInTransaction = 10 * time.Second
	}
	if o.LiveWorker <= 0 {
		o.LiveWorker = time.Minute
	}
	if o.ApplicationName == "" {
		o.ApplicationName = "pgflow-upgrade audit"
	}
	return o
}

// selection resolves opts.Checks (unknown IDs are an error), by default
// the checks declared for moment m and opts.Hop, plus Extra.
func selection(opts Options, m Moment) ([]Check, error) {
	var out []Check
	if len(opts.Checks) == 0 {
		out = For(m, opts.Hop)
	} else {
		seen := map[string]bool{}
		for _, id := range opts.Checks {
			c, err := Lookup(id)
			if err != nil {
				return nil, err
			}
			if !seen[id] {
				seen[id] = true
				out = append(out, c)
			}
		}
	}
	return append(out, opts.Extra...), nil
}

// Run audits the database behind conn: each selected check in its own READ
// ONLY transaction with its own budget, within a total budget. The error is
// for what stops the whole audit (a bad check ID, a broken connection before
// anything ran); a failing check is reported in its CheckResult.
func Run(ctx context.Context, conn *pgx.Conn, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	checks, err := selection(opts, InAudit)
	if err != nil {
		return nil, err
	}
	rep := &Report{Mode: ModeAudit.String(), Sample: opts.Sample, Bound: opts.Bound, Started: time.Now().UTC()}
	start := time.Now()
	total := start.Add(opts.TotalTimeout)

	// The server, pgmq and schema facts every check may depend on: catalog
	// queries only, in one read-only transaction of their own.
	env := Env{Mode: ModeAudit, Sample: opts.Sample, Bound: opts.Bound,
		LongTransaction: opts.LongTransaction, IdleInTransaction: opts.IdleInTransaction, LiveWorker: opts.LiveWorker}
	if err := func() error {
		tx, err := session.BeginReadOnly(ctx, conn, opts.CheckTimeout, opts.LockTimeout, opts.ApplicationName)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := tx.QueryRow(ctx, `select pg_catalog.current_setting('server_version'), pg_catalog.current_database()`).
			Scan(&rep.ServerVersion, &rep.Database); err != nil {
			return fmt.Errorf("reading the server version: %w", err)
		}
		if env.PGMQ, err = pgmqver.Detect(ctx, tx); err != nil {
			return err
		}
		if env.Schema, err = versions.DetectSchema(ctx, tx); err != nil {
			return err
		}
		return nil
	}(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return nil, fmt.Errorf("%w (%s)", err, GrantsHint)
		}
		return nil, err
	}
	rep.PGMQ, rep.Schema, rep.PgflowVersion = env.PGMQ, env.Schema, env.Schema.Version

	for _, c := range checks {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		remaining := time.Until(total)
		if remaining <= 0 {
			rep.Checks = append(rep.Checks, CheckResult{ID: c.ID, Title: c.Title, Severity: c.Severity, Findings: []Finding{},
				Status: StatusInconclusive, Error: "not run: the audit's total budget (--timeout) was used up"})
			continue
		}
		budget := min(opts.CheckTimeout, remaining)
		rep.Checks = append(rep.Checks, runAudit(ctx, conn, c, env, budget, opts))
		if conn.IsClosed() {
			return nil, fmt.Errorf("the connection was lost during check %s", c.ID)
		}
	}
	rep.DurationMS = time.Since(start).Milliseconds()
	return rep, nil
}

func runAudit(ctx context.Context, conn *pgx.Conn, c Check, env Env, budget time.Duration, opts Options) CheckResult {
	res := CheckResult{ID: c.ID, Title: c.Title, Severity: c.Severity}
	why := unmet(c.Needs, env)
	if why == "" && !env.planHas(c.Hop) {
		// Asked for by ID: a hop's check answers only for a plan with its hop.
		why = fmt.Sprintf("the plan has no hop to upstream's file %d", c.Hop)
	}
	if why != "" {
		res.Status, res.Error, res.Findings = StatusSkipped, why, []Finding{}
		return res
	}
	start := time.Now()
	env.Deadline = start.Add(budget)
	// Lock waits never exceed the budget either.
	tx, err := session.BeginReadOnly(ctx, conn, budget, min(opts.LockTimeout, budget), opts.ApplicationName)
	if err == nil {
		var findings []Finding
		findings, err = c.Run(ctx, c, tx, env)
		_ = tx.Rollback(context.WithoutCancel(ctx)) // read-only: nothing to keep
		res.Findings = findings
	}
	res.DurationMS = time.Since(start).Milliseconds()
	classify(&res, err)
	return res
}

// RunPreflight runs the checks declared for opts.At (UnderLocks unless
// said) and opts.Hop (or opts.Checks) inside the caller's transaction tx
// (apply's, under its locks), with the same SQL as the audit. The caller
// chooses the moment: the checks of every plan right after the locks, a
// hop's own checks right before that hop (and, declared BeforeLocks, before
// apply builds anything for it). Each check runs in a savepoint with statement_timeout =
// opts.CheckTimeout; the savepoint is always rolled back, so the caller's
// settings, locks and transaction are as before, whatever the check did.
// The error is for what stops the whole preflight (a bad check ID, a broken
// transaction).
func RunPreflight(ctx context.Context, tx pgx.Tx, opts Options) ([]CheckResult, error) {
	opts = opts.withDefaults()
	at := opts.At
	if at == 0 {
		at = UnderLocks
	}
	checks, err := selection(opts, at)
	if err != nil {
		return nil, err
	}
	env := Env{Mode: ModePreflight, Sample: opts.Sample, Bound: opts.Bound,
		LongTransaction: opts.LongTransaction, IdleInTransaction: opts.IdleInTransaction, LiveWorker: opts.LiveWorker}
	if opts.PGMQ != nil {
		env.PGMQ = *opts.PGMQ
	} else if env.PGMQ, err = pgmqver.Detect(ctx, tx); err != nil {
		return nil, err
	}
	if opts.Schema != nil {
		env.Schema = *opts.Schema
	} else if env.Schema, err = versions.DetectSchema(ctx, tx); err != nil {
		return nil, err
	}
	var out []CheckResult
	for _, c := range checks {
		res := CheckResult{ID: c.ID, Title: c.Title, Severity: c.Severity}
		if why := unmet(c.Needs, env); why != "" {
			res.Status, res.Error, res.Findings = StatusSkipped, why, []Finding{}
			out = append(out, res)
			continue
		}
		start := time.Now()
		env.Deadline = start.Add(opts.CheckTimeout)
		// The savepoint and its statement_timeout in one round trip, and
		// its rollback and release in another: under apply's locks each
		// round trip is time the application waits.
		opened, err := checkSavepoint(ctx, tx, opts.CheckTimeout)
		if !opened {
			return out, fmt.Errorf("preflight check %s: opening a savepoint: %w", c.ID, err)
		}
		var findings []Finding
		if err == nil {
			findings, err = c.Run(ctx, c, tx, env)
		}
		// Always roll back: restores statement_timeout, releases the check's
		// locks, and clears an aborted subtransaction.
		if rbErr := endCheckSavepoint(context.WithoutCancel(ctx), tx); rbErr != nil {
			return out, fmt.Errorf("preflight check %s: rolling back its savepoint: %w", c.ID, rbErr)
		}
		res.Findings = findings
		res.DurationMS = time.Since(start).Milliseconds()
		classify(&res, err)
		out = append(out, res)
	}
	return out, nil
}

// errBudget: a check that loops over queues ran past its Deadline.
var errBudget = errors.New("the check's time budget (--check-timeout) ran out")

// classify sets the status of res from the check's error.
func classify(res *CheckResult, err error) {
	if res.Findings == nil {
		res.Findings = []Finding{} // JSON: always an array
	}
	var pe *PartialError
	if errors.As(err, &pe) {
		cov := pe.Coverage
		res.Coverage = &cov
		// What a stopped check found so far is no verdict: not shown.
		res.Findings = []Finding{}
	}
	switch {
	case err == nil && len(res.Findings) == 0:
		res.Status = StatusOK
	case err == nil:
		res.Status = StatusFindings
	case isTimeout(err) && res.Coverage != nil:
		res.Status, res.Err = StatusInconclusive, err
		res.Error = "inconclusive: " + res.Coverage.String() + " when the check stopped: " + err.Error()
	case isTimeout(err):
		res.Status, res.Err, res.Error = StatusInconclusive, err, "inconclusive: "+err.Error()
	default:
		res.Status, res.Err, res.Error = StatusError, err, err.Error()
		if res.Coverage != nil {
			res.Error += " (" + res.Coverage.String() + " when it stopped)"
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
			res.Error += "; " + GrantsHint
		}
	}
}

// GrantsHint says which grants the audit needs (docs/audit.md, "Privileges").
const GrantsHint = "the audit needs: grant usage on schema pgflow, pgmq to <role>; grant select on all tables in schema pgflow, pgmq to <role>"

// isTimeout: statement timeout / cancel (57014), lock timeout (55P03), or the
// check's own budget.
func isTimeout(err error) bool {
	if errors.Is(err, errBudget) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57014" || pgErr.Code == "55P03"
	}
	return false
}

// planHas says whether the plan from the release env found takes the hop
// to upstream's file hop (EveryPlan: always).
func (e Env) planHas(hop HopFile) bool {
	if hop == EveryPlan {
		return true
	}
	d := e.Schema.Version
	return d != nil && d.Release != nil && d.Release.Files < int(hop) && int(hop) <= len(versions.UpstreamFiles())
}

// unmet says why a check cannot run in env ("" when it can).
func unmet(n Requirement, env Env) string {
	if n&NeedsPgflow != 0 && !env.Schema.HasTables {
		return "no pgflow tables (schema state " + string(env.Schema.State) + ")"
	}
	if n&NeedsPGMQ != 0 && !env.PGMQ.Installed {
		return "pgmq is not installed"
	}
	return ""
}

// tighten lowers statement_timeout to what is left of the check's budget,
// before one more query of a loop; errBudget once it is gone.
func tighten(ctx context.Context, q Querier, env Env) error {
	if env.Deadline.IsZero() {
		return nil
	}
	left := time.Until(env.Deadline)
	if left <= 0 {
		return errBudget
	}
	if err := (session.Limits{Statement: left}).Set(ctx, q); err != nil {
		return fmt.Errorf("setting statement_timeout: %w", err)
	}
	return nil
}

// checkSavepoint opens the savepoint a preflight check runs in and sets
// its statement_timeout, as one pipeline. opened is false when there is no
// savepoint to roll back to; err, when opened, is the setting's error.
func checkSavepoint(ctx context.Context, tx pgx.Tx, timeout time.Duration) (opened bool, err error) {
	b := &pgx.Batch{}
	b.Queue(`savepoint pgflow_upgrade_check`)
	b.Queue(`select pg_catalog.set_config('statement_timeout', $1, true)`, fmt.Sprintf("%dms", max(timeout.Milliseconds(), 1)))
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return false, err
	}
	_, err = br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return true, err
}

// endCheckSavepoint rolls the check's savepoint back and releases it.
func endCheckSavepoint(ctx context.Context, tx pgx.Tx) error {
	b := &pgx.Batch{}
	b.Queue(`rollback to savepoint pgflow_upgrade_check`)
	b.Queue(`release savepoint pgflow_upgrade_check`)
	return tx.SendBatch(ctx, b).Close()
}
