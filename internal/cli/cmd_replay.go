package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/junit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// `fixtures replay` and `fixtures capture` (docs/fixtures.md).

func (a *App) fixturesReplayCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "replay",
		Usage: "prove the upgrade on throwaway databases: run the built-in scenarios (or those named), or replay a captured database (--from)",
		Description: "Each scenario runs on its own throwaway database. Where they come from: --dsn (or PGFLOW_UPGRADE_DSN, DATABASE_URL, PG*)\n" +
			"names a server on which databases are created and dropped; else a Docker engine (unless PGFLOW_UPGRADE_NO_DOCKER=1);\n" +
			"else an ephemeral cluster from the PostgreSQL binaries on this machine. Exit 1 when any scenario fails.\n" +
			"The road-* scenarios start from databases built by running your copy of pgflow's migration files (--pgflow-migrations DIR)\n" +
			"up to a release, then apply to upstream's newest; without --pgflow-migrations they are reported as skipped (not passed).\n" +
			"--from CAPTURE rehearses the plan apply would run on the captured database (from its release to upstream's newest) on copies of it.",
		ArgsUsage: "[NAME...]",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "dsn", Usage: "server for the throwaway databases (same as the global --dsn)"},
			&ucli.StringFlag{Name: "junit", Usage: "also write the results as JUnit XML to `FILE`"},
			&ucli.StringFlag{Name: "from", Usage: "rehearse apply's plan on the capture `FILE` (from `fixtures capture`, of any release a plan starts from) instead of the built-in scenarios; a plan that runs upstream's files needs --pgflow-migrations"},
			&ucli.IntFlag{Name: "parallel", Value: 4, Usage: "scenarios run at once (with --from the default is 1: the measured timings are not shared with other scenarios)"},
			&ucli.DurationFlag{Name: "max-lock-window", Usage: "with --from: fail capture-upgrade-survives when the transactional apply holds its locks longer than `DURATION` (the figure is always reported)"},
			&ucli.DurationFlag{Name: "max-wait", Usage: "with --from: fail capture-online-survives when the probe (a read and an update of a task row every 10 ms) waits longer than `DURATION` during apply --online (always reported)"},
			&ucli.StringFlag{Name: "calibration-out", Usage: "with --from: write the rehearsal's measured sizes and timings to `FILE`, for `audit --calibration FILE`"},
			&ucli.StringFlag{Name: "pgmq", Usage: "with --from: rehearse apply --pgmq `VERSION` (the pgmq hop after pgflow's, one transaction): its lock window measured on the capture, pgmq's queue list compared with the repairs it reports"},
			&ucli.StringFlag{Name: "to", Usage: "with --from: the release the rehearsed plan ends at, as apply's --to: 0.17.0 (this tool's own hop only), 0.17.1 or " + versions.Newest + " (default: upstream's newest, " + versions.Newest + ")"},
			&ucli.StringFlag{Name: "pgflow-migrations", Usage: "the folder holding your copy of pgflow's own migration files (as apply's flag: recognised by their atlas.sum hash, whatever their names): the road-* scenarios build databases from it up to a release and apply takes them to upstream's newest (without it they are skipped, saying so); with --from the rehearsal's plan runs upstream's files from it (without it a plan from another release than 0.16.0 is refused, exit 1, naming the files)"},
		},
		Action: a.fixturesReplay,
	}
}

func (a *App) fixturesCaptureCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "capture",
		Usage: "write a pgflow database's state, pgmq queue and archive rows included, to a file for `fixtures replay --from` (any release a plan to upstream's newest starts from; other states are refused)",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "dsn", Usage: "the database to capture (same as the global --dsn)"},
			&ucli.StringFlag{Name: "out", Usage: "write the capture to `FILE` (- for stdout): a new file, or with --force an existing regular file; anything else (symlink, FIFO, device, directory) is refused", Required: true},
			&ucli.BoolFlag{Name: "force", Usage: "replace the --out file if it exists (a regular file only)"},
			&ucli.BoolFlag{Name: "redact", Usage: "replace run inputs and step outputs with placeholders (rows of --include-schema schemas are kept as they are)"},
			&ucli.StringSliceFlag{Name: "include-schema", Usage: "also capture schema `NAME` (its DDL and rows), e.g. a schema of yours that references pgflow; repeatable"},
		},
		Action: a.fixturesCapture,
	}
}

// dsnValue is --dsn given after the subcommand, else before it.
func dsnValue(c *ucli.Context) string {
	for _, x := range c.Lineage() {
		if x == nil {
			continue
		}
		if v := x.String("dsn"); v != "" {
			return v
		}
	}
	return ""
}

type replayReport struct {
	Provider  string            `json:"provider"`
	From      string            `json:"from,omitempty"`
	Capture   *capture.Header   `json:"capture,omitempty"` // the capture's header: versions, table sizes
	Rehearsal *rehearsalReport  `json:"rehearsal,omitempty"`
	Scenarios []scenario.Result `json:"scenarios"`
	Passed    int               `json:"passed"`
	Failed    int               `json:"failed"`
	Skipped   int               `json:"skipped"`
	Seconds   float64           `json:"seconds"`
}

func (a *App) fixturesReplay(c *ucli.Context) error {
	ctx := c.Context
	plan, err := newReplayPlan(c)
	if err != nil {
		return err
	}
	t, err := a.resolveWith(dsnValue(c), "fixtures replay", true)
	if err != nil {
		return err
	}
	opts := a.replayProviderOptions(t)
	started := time.Now()
	srv, err := a.openReplayServer(ctx, t, opts)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(a.Stderr, "replay: throwaway databases on %s\n", srv.Describe())

	// Scenarios run in parallel and all log here, one line at a time; the
	// heartbeat (progress.go) says the run is alive when they are quiet.
	hb := a.startHeartbeat("replay: ", "scenarios running")
	defer hb.stop()
	results, err := a.runReplayScenarios(ctx, srv, plan, hb.printf)
	if ctx.Err() != nil {
		hb.stop()
		return a.replayInterrupted(results)
	}
	if err != nil {
		return err
	}
	rep := replayReport{Provider: srv.Describe(), From: plan.from, Scenarios: results, Seconds: time.Since(started).Seconds()}
	rep.Failed = scenario.Failed(results)
	rep.Passed = scenario.Passed(results)
	rep.Skipped = scenario.Skipped(results)
	if plan.captured != nil {
		rep.Capture = &plan.captured.Header
		rep.Rehearsal = newRehearsalReport(plan.rehearsal)
	}
	if err := a.writeReplayFiles(c, plan, results, started); err != nil {
		return err
	}
	if err := a.writeReplayOutput(c, rep, srv.Describe()); err != nil {
		return err
	}
	if rep.Failed > 0 {
		for _, res := range results {
			if !res.Passed && !res.Skipped {
				fmt.Fprintf(a.Stderr, "replay: FAIL %s: %s\n", res.Name, res.Error)
			}
		}
		return reportedError{fmt.Errorf("%d of %d scenarios failed", rep.Failed, len(results))}
	}
	return nil
}

// replayPlan is what `fixtures replay` was asked to run, checked from its
// flags and arguments before any database is made.
type replayPlan struct {
	from      string               // --from, the capture file; "" for the built-in scenarios
	captured  *capture.Info        // the validated capture; nil without --from
	rehearsal *rehearsal.Rehearsal // the budgets, and what the rehearsal measures
	selected  []scenario.Scenario  // the scenarios to run
	parallel  int                  // scenarios run at once
	junitPath string               // --junit
	// pgflowMigrations is --pgflow-migrations: the user's copy of
	// upstream's files the road scenarios build from ("": skipped).
	pgflowMigrations string
}

func newReplayPlan(c *ucli.Context) (*replayPlan, error) {
	p := &replayPlan{
		from:      c.String("from"),
		rehearsal: &rehearsal.Rehearsal{MaxLockWindow: c.Duration("max-lock-window"), MaxWait: c.Duration("max-wait"), PGMQ: c.String("pgmq")},
	}
	if v := p.rehearsal.PGMQ; v != "" {
		if _, err := pgmqver.Parse(v); err != nil {
			return nil, usageErrorf("--pgmq: %v", err)
		}
	}
	if p.rehearsal.MaxLockWindow < 0 || p.rehearsal.MaxWait < 0 {
		return nil, usageErrorf("--max-lock-window and --max-wait must be positive durations (e.g. 2s, 500ms)")
	}
	all := append(scenario.Builtin(), fleetScenario()) // the fleet is the command line's: its scenario lives here
	all = append(all, scenario.RoadScenarios()...)
	p.pgflowMigrations = c.String("pgflow-migrations")
	if p.pgflowMigrations != "" {
		// A folder that cannot be read, or holds none of upstream's files,
		// is refused before any database is made; one lacking a file the
		// road scenarios need, or holding one altered, fails them (exit 1),
		// naming the file, as apply refuses it (a rehearsal's plan refuses
		// it first: planRehearsal).
		var fileErr *pgflowfiles.FileError
		if _, err := pgflowfiles.Find(p.pgflowMigrations, 1); err != nil && !errors.As(err, &fileErr) {
			return nil, withCode(ExitUsage, fmt.Errorf("--pgflow-migrations: %w", err))
		}
	}
	if err := toFlag(c); err != nil {
		return nil, err
	}
	p.rehearsal.To = c.String("to")
	if p.from != "" {
		captured, err := validateReplayCapture(p.from)
		if err != nil {
			return nil, err
		}
		p.captured = captured
		if err := p.planRehearsal(); err != nil {
			return nil, err
		}
		all = rehearsal.Scenarios(p.rehearsal)
	} else {
		for _, f := range []string{"max-lock-window", "max-wait", "calibration-out", "pgmq", "to"} {
			if c.IsSet(f) {
				return nil, usageErrorf("--%s needs --from CAPTURE: it budgets or records the rehearsal of a captured database", f)
			}
		}
	}
	selected, err := scenario.Select(all, c.Args().Slice())
	if err != nil {
		return nil, withCode(ExitUsage, err)
	}
	p.selected = selected
	p.parallel = c.Int("parallel")
	if p.captured != nil && !c.IsSet("parallel") {
		p.parallel = 1
	}
	if p.parallel < 1 {
		return nil, usageErrorf("--parallel must be at least 1")
	}
	p.junitPath = c.String("junit")
	return p, nil
}

// planRehearsal makes apply's plan from the capture's release to --to
// (default upstream's newest), as apply makes it with the files given
// (none: the plan ends where this tool's own hops end), before anything is
// restored.
// A plan whose first hop needs upstream's files and has none is refused
// (exit 1, as apply refuses it), naming the files; so is a copy lacking a
// file, or holding one altered.
func (p *replayPlan) planRehearsal() error {
	from, err := p.captured.Header.PlanStart()
	if err != nil {
		return withCode(ExitFindings, fmt.Errorf("--from %s: %w", p.from, err))
	}
	toName := p.rehearsal.To
	if toName == "" {
		toName = versions.Newest
	}
	to, err := versions.LookupRelease(toName)
	if err != nil {
		return err
	}
	if from >= to.Files {
		return withCode(ExitFindings, fmt.Errorf("--from %s: the captured database is at %s, already at or past %s: nothing to rehearse (name a later release with --to)",
			p.from, versions.StateName(from), to.Name))
	}
	var copy *pgflowfiles.Copy
	if p.pgflowMigrations != "" {
		if copy, err = pgflowfiles.Find(p.pgflowMigrations, to.Files); err != nil {
			return withCode(ExitFindings, fmt.Errorf("--pgflow-migrations: cannot rehearse the plan from %s: %w", versions.StateName(from), err))
		}
	}
	plan := upgrade.MakePlan(from, to, copy, false)
	if len(plan.Hops) == 0 {
		return withCode(ExitFindings, fmt.Errorf("--from %s: %w: cannot rehearse the plan from pgflow %s: %s",
			p.from, upgrade.ErrNoUpstreamFiles, plan.From, plan.Rest))
	}
	p.rehearsal.Plan, p.rehearsal.PgflowMigrations = plan, p.pgflowMigrations
	return nil
}

// validateReplayCapture reads the capture file whole before any database is
// created, as a stream: memory stays bounded whatever the file's size
// (capture.Limits). Only a capture a plan starts from has an upgrade to
// rehearse (capture.Header.PlanStart).
func validateReplayCapture(from string) (*capture.Info, error) {
	f, err := os.Open(from)
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("--from: %w", err))
	}
	captured, err := capture.Validate(bufio.NewReaderSize(f, 1<<20), capture.DefaultLimits)
	f.Close()
	if errors.Is(err, capture.ErrCaptureLimit) {
		return nil, withCode(ExitUsage, fmt.Errorf("--from %s: %w; the limits are in docs/fixtures.md (\"Capture file format\")", from, err))
	}
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("--from %s: %w; capture the database again with `pgflow-upgrade fixtures capture --out FILE`", from, err))
	}
	if _, err := captured.Header.PlanStart(); err != nil {
		return nil, withCode(ExitFindings, fmt.Errorf("--from %s: %w", from, err))
	}
	return captured, nil
}

// replayProviderOptions says where the throwaway databases come from: the
// resolved server when one was named, else Docker or local binaries.
func (a *App) replayProviderOptions(t *target) pgprovider.Options {
	opts := pgprovider.Options{
		DockerImage: a.Getenv("PGFLOW_UPGRADE_DOCKER_IMAGE"),
		SkipDocker:  a.Getenv("PGFLOW_UPGRADE_NO_DOCKER") == "1",
		// The scenarios' sessions are the tool's too: pinned search_path.
		PinSearchPath: true,
		Logf:          func(f string, args ...any) { fmt.Fprintf(a.Stderr, f+"\n", args...) },
	}
	if t.resolved.Source != session.SourceNone {
		opts.DSN = t.resolved.DSN
	}
	return opts
}

// openReplayServer opens the server of the throwaway databases; the caller
// closes it.
func (a *App) openReplayServer(ctx context.Context, t *target, opts pgprovider.Options) (*pgprovider.Server, error) {
	srv, err := pgprovider.Open(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, withCode(ExitEnvironment, errors.New(a.redact(err.Error())))
	}
	if opts.DSN != "" {
		// The throwaway databases are made from this session: a standby or
		// a read-only default would refuse each with a raw 25006.
		if err := a.replayPrecheck(ctx, t); err != nil {
			srv.Close()
			return nil, err
		}
	}
	return srv, nil
}

// runReplayScenarios fills the template database (the 0.16.0 engine, or
// the capture restored) and runs the selected scenarios on copies of it.
func (a *App) runReplayScenarios(ctx context.Context, srv *pgprovider.Server, plan *replayPlan, logf func(string, ...any)) ([]scenario.Result, error) {
	r := &scenario.Runner{Server: srv, Parallel: plan.parallel, Logf: logf, PgflowMigrations: plan.pgflowMigrations}
	if plan.captured != nil {
		a.describeCapture(plan.from, plan.captured)
		fmt.Fprintf(a.Stderr, "replay: rehearsing apply's plan: %s\n", plan.rehearsal.PlanSummary())
		r.Baseline = func(ctx context.Context, conn *pgx.Conn) error {
			return capture.RestoreFile(ctx, conn, plan.from, capture.DefaultLimits)
		}
	}
	if v, dir, to := plan.rehearsal.PGMQ, plan.rehearsal.PgflowMigrations, plan.rehearsal.To; v != "" || dir != "" || to != "" {
		r.Upgrade = func(ctx context.Context, db *scenario.DB) (*outcome.Result[*upgrade.Report], error) {
			return scenario.RunApplyWith(ctx, db, upgrade.Options{PGMQ: v, PgflowMigrations: dir, To: to})
		}
	}
	if _, err := r.Template(ctx); err != nil {
		_ = r.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if plan.captured != nil {
			return nil, withCode(ExitFindings, fmt.Errorf("restoring %s: %w", plan.from, err))
		}
		return nil, withCode(ExitEnvironment, err)
	}
	results := r.Run(ctx, plan.selected)
	if err := r.Close(); err != nil {
		fmt.Fprintf(a.Stderr, "replay: %v\n", err)
	}
	return results, ctx.Err()
}

// replayInterrupted ends a replay the operator cancelled: what had
// finished, and which scenarios were cut short or never started (none of
// them failed), exit 130.
func (a *App) replayInterrupted(results []scenario.Result) error {
	var passed, failed []string
	for _, r := range results {
		switch {
		case r.Interrupted, r.Skipped: // neither passed nor failed
		case r.Passed:
			passed = append(passed, r.Name)
		default:
			failed = append(failed, r.Name)
		}
	}
	cut := scenario.Interrupted(results)
	if len(results) == 0 {
		msg := "interrupted before any scenario ran; every throwaway database is dropped"
		fmt.Fprintf(a.Stderr, "replay: %s\n", msg)
		return reportedError{withCode(ExitInterrupted, errors.New(msg))}
	}
	msg := fmt.Sprintf("interrupted: %d scenario(s) passed and %d failed before the interrupt, %d interrupted (not failed): %s; every throwaway database is dropped",
		len(passed), len(failed), len(cut), strings.Join(cut, ", "))
	if len(failed) > 0 {
		msg += "; failed before the interrupt: " + strings.Join(failed, ", ")
	}
	if n := scenario.Skipped(results); n > 0 {
		msg += fmt.Sprintf("; %d skipped (not run: see each one's reason)", n)
	}
	fmt.Fprintf(a.Stderr, "replay: %s\n", msg)
	return reportedError{withCode(ExitInterrupted, errors.New(msg))}
}

// describeCapture says on stderr which capture is being restored.
func (a *App) describeCapture(from string, captured *capture.Info) {
	h := captured.Header
	fmt.Fprintf(a.Stderr, "replay: restoring %s (captured %s, %d records", from, h.CreatedAt.Format(time.RFC3339), captured.Records)
	if h.Version >= 2 {
		release := h.PgflowVersion
		if h.Release != nil {
			release = h.Release.Name
		}
		fmt.Fprintf(a.Stderr, "; pgflow %s on pgmq %s, PostgreSQL %s, schemas %s, %d step_tasks rows", release, h.PGMQ, h.ServerVersion, strings.Join(h.Schemas, ", "), h.Rows("pgflow.step_tasks"))
	} else {
		fmt.Fprintf(a.Stderr, "; a version 1 file: its rows are restored into this tool's own pgflow 0.16.0 schema, not an exact rebuild")
	}
	fmt.Fprintln(a.Stderr, ")")
}

// writeReplayFiles writes the files asked for: the rehearsal's calibration
// (--calibration-out, with --from) and the JUnit XML (--junit).
func (a *App) writeReplayFiles(c *ucli.Context, plan *replayPlan, results []scenario.Result, started time.Time) error {
	if plan.captured != nil {
		if path := c.String("calibration-out"); path != "" {
			if err := writeCalibration(path, plan.from, plan.rehearsal); err != nil {
				return withCode(ExitEnvironment, err)
			}
			fmt.Fprintf(a.Stderr, "replay: calibration written to %s\n", path)
		}
	}
	if plan.junitPath != "" {
		if err := writeJUnitFile(plan.junitPath, started, junitNames(results, plan.from)); err != nil {
			return withCode(ExitEnvironment, err)
		}
	}
	return nil
}

// writeReplayOutput writes the report to stdout: JSON, or a table of the
// scenarios, the rehearsal's measures and a summary line.
func (a *App) writeReplayOutput(c *ucli.Context, rep replayReport, provider string) error {
	if jsonOutput(c) {
		return writeJSON(a.Stdout, rep)
	}
	var rows [][]string
	for _, res := range rep.Scenarios {
		status, detail := "PASS", res.Proves // writeTable wraps it to fit
		if len(res.Notes) > 0 {
			detail += "\n→ " + strings.Join(res.Notes, "\n→ ")
		}
		switch {
		case res.Skipped:
			status = "SKIP"
			detail = res.Proves + "\n– not run: " + res.SkipReason
		case !res.Passed:
			status = "FAIL"
			detail = res.Proves + "\n✗ " + shorten(res.Error, 600)
		}
		took := fmt.Sprintf("%.1fs", res.Seconds)
		if res.Skipped {
			took = "-"
		}
		rows = append(rows, []string{res.Name, status, took, detail})
	}
	if err := writeTable(a.Stdout, []string{"scenario", "result", "time", "what it proves"}, rows); err != nil {
		return err
	}
	if rep.Rehearsal != nil {
		if err := writeTable(a.Stdout, []string{"measured", "value", "budget"}, rep.Rehearsal.rows()); err != nil {
			return err
		}
	}
	skipped := ""
	if rep.Skipped > 0 {
		skipped = fmt.Sprintf(", %d skipped", rep.Skipped)
	}
	fmt.Fprintf(a.Stdout, "%d passed, %d failed%s in %.1fs on %s\n", rep.Passed, rep.Failed, skipped, rep.Seconds, provider)
	return nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + " ..."
}

func writeJUnitFile(path string, started time.Time, results []scenario.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	if err := junit.Write(f, "pgflow-upgrade fixtures replay", started, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// outError is the exit code of a failed capture into a file: 2 for a
// refused target, 3 when the file system failed, 1 when the capture did.
func outError(err error) error {
	var pathErr *fs.PathError
	var linkErr *os.LinkError
	switch {
	case errors.Is(err, errOutTarget):
		return withCode(ExitUsage, err)
	case errors.As(err, &pathErr) || errors.As(err, &linkErr):
		return withCode(ExitEnvironment, err)
	default:
		return withCode(ExitFindings, err)
	}
}

func (a *App) fixturesCapture(c *ucli.Context) error {
	ctx := c.Context
	if c.NArg() > 0 {
		return usageErrorf("fixtures capture takes no arguments (got %q)", c.Args().First())
	}
	t, err := a.resolveWith(dsnValue(c), "fixtures capture", false)
	if err != nil {
		return err
	}
	out := c.String("out")
	if out != "-" {
		// Refused before anything else happens (exit 2, target untouched).
		if err := checkOutTarget(out, c.Bool("force")); err != nil {
			return outError(err)
		}
	}
	conn, err := a.connect(ctx, t)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if kind, err := fixtures.PGMQKind(ctx, conn); err != nil {
		return withCode(ExitEnvironment, err)
	} else if kind == "" {
		return withCode(ExitFindings, fmt.Errorf("fixtures capture: %s has no pgmq schema: not a pgflow database", session.Describe(t.config)))
	}
	opts := capture.Options{Redact: c.Bool("redact"), Source: session.Describe(t.config), IncludeSchemas: c.StringSlice("include-schema")}
	var n int
	if out == "-" {
		n, err = capture.Write(ctx, conn, a.Stdout, opts)
		if err != nil {
			return withCode(ExitFindings, err)
		}
	} else {
		// A new file next to the target, renamed over it once complete
		// (outfile.go): a failed capture leaves the target as it was.
		err = writeOutFile(out, c.Bool("force"), func(w io.Writer) error {
			var err error
			if n, err = capture.Write(ctx, conn, w, opts); err != nil {
				return fmt.Errorf("capturing %s: %w", opts.Source, err)
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return outError(err)
		}
	}
	if out == "-" {
		return nil
	}
	if jsonOutput(c) {
		return writeJSON(a.Stdout, map[string]any{"file": out, "records": n, "redacted": opts.Redact, "database": opts.Source, "schemas": append([]string{"pgflow"}, opts.IncludeSchemas...)})
	}
	fmt.Fprintf(a.Stdout, "captured %d records of %s into %s%s\n", n, opts.Source, out, map[bool]string{true: " (redacted)", false: ""}[opts.Redact])
	return nil
}

// replayPrecheck refuses a server on which replay could make no database:
// a standby, a read-only default (envcheck.go), as apply does.
func (a *App) replayPrecheck(ctx context.Context, t *target) error {
	conn, err := a.connect(ctx, t)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := writePrecheck(ctx, conn, "fixtures replay"); err != nil {
		return withCode(ExitEnvironment, fmt.Errorf("fixtures replay on %s: %w", session.Describe(t.config), err))
	}
	return nil
}
