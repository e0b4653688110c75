package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fleet"
)

const fleetDescription = `Runs one command over many databases, each target exactly as the single command runs
on it alone (in-process: the same verdict, exit code, blockers and forecast), and prints
one report: the fleet's verdict on the first line, then one row per target, targets
grouped by state (the same catalog, verdict and blocker and warning checks: "9 databases
in the same state as prod-eu"), so that one review covers a group; then the targets that
gave no answer (unreachable, wrong password, not started) with their cause.

Targets (--targets FILE, - for standard input): one a line, "NAME DSN" or a bare DSN
(named host/database), # starts a comment. A line that cannot be used is refused with
its number and why (exit 2), never with its text. Passwords are never printed; a file
that holds passwords and that its group or others can read gets a warning. A DSN
without a password uses PGPASSWORD or the password file (~/.pgpass, PGPASSFILE) as libpq
does.

Exit code: the worst target's, in the order 130 (interrupted), 2, 3 (not reached),
1 (findings, refused, failed), 4 (cannot tell), 0.
--ledger FILE records every target's outcome (rewritten atomically after each), so a
rerun resumes: apply checks the targets the ledger has at the destination (verify) and
skips them, retries a failed one only with --retry-failed (a failed target whose state
changed since is audited again, and applied when the audit says GO), and runs the rest.
--shard I/N runs the targets whose name hashes to shard I of N (a CI matrix); fleet
report LEDGER... merges the shards' ledgers into the report one unsharded run prints.`

// fleetCommand is `fleet audit|status|verify|apply|report`.
func (a *App) fleetCommand() *ucli.Command {
	return &ucli.Command{
		Name:        "fleet",
		Usage:       "run audit, status, verify or apply over many databases (--targets FILE): staged, resumable, sharded, one report",
		Description: fleetDescription,
		Subcommands: []*ucli.Command{
			a.fleetRunCommand("audit", "audit every target (read-only) and group them by state", a.auditCommand(),
				[]string{"sample", "check", "bound", "check-timeout", "timeout", "lock-timeout", "calibration", "online-threshold"}),
			a.fleetRunCommand("status", "the pgflow version and next step of every target", a.statusCommand(), nil),
			a.fleetRunCommand("verify", "verify every target (read-only)", a.verifyCommand(),
				[]string{"routes", "grace", "heartbeat-interval", "check-timeout", "lock-timeout"}),
			a.fleetRunCommand("apply", "apply, then verify, on every target: canaries first, then in parallel, up to a failure limit", a.applyCommand(),
				[]string{"dry-run", "wait", "lock-timeout", "lock-retries", "sample", "check-timeout",
					"online", "batch-size", "max-rate", "pause", "max-replica-lag", "quiesce", "drain-timeout",
					"to", "telemetry", "pgflow-migrations", "pgmq"}),
			a.fleetReportCommand(),
		},
	}
}

// fleetFormatFlag: the fleet commands also print Markdown.
func fleetFormatFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "format", Value: "table", Usage: "output format: table, json or markdown (a CI job summary, a pull-request comment)"}
}

// fleetRunCommand is one of fleet audit|status|verify|apply: the fleet's
// own flags, and those of single's flags named in pass, given to every
// target's command as typed (a name single does not have is left out:
// apply's --to and --telemetry where they exist).
func (a *App) fleetRunCommand(name, usage string, single *ucli.Command, pass []string) *ucli.Command {
	// A read-only command answers in minutes; an upgrade (an online
	// backfill of a large table) may rightly take longer: no limit.
	timeout, timeoutText := 10*time.Minute, "10m"
	if name == "apply" {
		timeout, timeoutText = 0, "none"
	}
	flags := []ucli.Flag{
		&ucli.StringFlag{Name: "targets", Required: true, Usage: "the targets `FILE` (- for standard input): one a line, NAME DSN or a bare DSN, # comments"},
		&ucli.IntFlag{Name: "parallel", Value: 4, Usage: "targets run at once"},
		&ucli.DurationFlag{Name: "target-timeout", Value: timeout, DefaultText: timeoutText,
			Usage: "the longest one target may take (then: exit 4, what it was doing rolled back; 0: no limit)"},
		&ucli.StringFlag{Name: "ledger", Usage: "record every target's outcome in this JSON `FILE` (atomically, after each); a rerun with it resumes"},
		&ucli.StringFlag{Name: "shard", Usage: "run only shard `I/N` of the targets (by a hash of their names; 1 <= I <= N), for a CI matrix; merge with fleet report"},
		&ucli.StringFlag{Name: "junit", Usage: "also write one JUnit test case per target to `FILE`"},
		fleetFormatFlag(),
	}
	if name == "apply" {
		flags = append(flags,
			&ucli.BoolFlag{Name: "yes", Usage: "required: apply changes every target"},
			&ucli.IntFlag{Name: "canary", Usage: "run the first N targets first, one at a time; unless all pass, nothing else starts"},
			&ucli.IntFlag{Name: "max-failures", Value: 1, Usage: "after K failed targets no new one starts (0: no limit)"},
			&ucli.BoolFlag{Name: "retry-failed", Usage: "with --ledger: run again the targets that failed in it"},
		)
	}
	var passed []string
	for _, f := range single.Flags {
		for _, p := range pass {
			if f.Names()[0] == p {
				flags = append(flags, f)
				passed = append(passed, p)
			}
		}
	}
	desc := fleetDescription
	if len(passed) > 0 {
		desc += "\nGiven to every target's " + name + " as typed: --" + strings.Join(passed, ", --") + " (see `pgflow-upgrade " + name + " --help`)."
	}
	return &ucli.Command{
		Name: name, Usage: usage, Description: desc, Flags: flags,
		Action: func(c *ucli.Context) error { return a.fleetAction(c, name, passed) },
	}
}

func (a *App) fleetReportCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "report",
		Usage:     "merge the ledgers of a fleet run's shards into the report one unsharded run prints",
		ArgsUsage: "LEDGER...",
		Description: "Reads the --ledger files of the shards of one run (or the ledger of one run) and prints\n" +
			"its report: the same verdict, groups, rows and exit code as the unsharded run. A shard\n" +
			"whose ledger is not given is named on stderr; its targets are rows \"NOT RUN\" (exit 4).",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "junit", Usage: "also write one JUnit test case per target to `FILE`"},
			fleetFormatFlag(),
		},
		Action: func(c *ucli.Context) error {
			if c.NArg() == 0 {
				return usageErrorf("fleet report: give one or more ledger files (written by --ledger)")
			}
			rep, notes, err := fleet.Merge(c.Args().Slice())
			if err != nil {
				return withCode(ExitUsage, err)
			}
			for _, n := range notes {
				fmt.Fprintln(a.Stderr, "pgflow-upgrade fleet report: "+n)
			}
			return a.finishFleet(c, rep)
		},
	}
}

// fleetRun is one fleet command's settings.
type fleetRun struct {
	command string
	pass    []string // the single command's flags, as typed
	plan    fleet.Plan
	timeout time.Duration
	retry   bool
	ledger  *fleet.Ledger

	progress sync.Mutex
	done     int
	todo     int
}

func (a *App) fleetAction(c *ucli.Context, command string, pass []string) error {
	if c.IsSet("dsn") {
		return usageErrorf("fleet %s takes its databases from --targets FILE, not --dsn (a file of one line will do)", command)
	}
	all, err := a.readTargets(c.String("targets"))
	if err != nil {
		return err
	}
	shard := fleet.Shard{}
	if s := c.String("shard"); s != "" {
		if shard, err = fleet.ParseShard(s); err != nil {
			return withCode(ExitUsage, err)
		}
	}
	r := &fleetRun{command: command, timeout: c.Duration("target-timeout"),
		plan: fleet.Plan{Parallel: c.Int("parallel")}}
	if r.plan.Parallel < 1 || r.timeout < 0 {
		return usageErrorf("fleet %s: --parallel must be at least 1 and --target-timeout not negative", command)
	}
	if command == "apply" {
		if !c.Bool("yes") {
			return usageErrorf("fleet apply changes every target and locks its pgflow tables: pass --yes")
		}
		r.plan.Canary, r.plan.MaxFailures, r.retry = c.Int("canary"), c.Int("max-failures"), c.Bool("retry-failed")
		if r.plan.Canary < 0 || r.plan.MaxFailures < 0 {
			return usageErrorf("fleet apply: --canary and --max-failures must not be negative")
		}
	}
	r.pass = passArgs(c, pass)
	if r.ledger, err = fleet.OpenLedger(c.String("ledger"), command, shard, all); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return withCode(ExitEnvironment, fmt.Errorf("--ledger: %w", err))
		}
		return withCode(ExitUsage, fmt.Errorf("--ledger: %w", err))
	}
	mine := shard.Select(all)
	r.todo = len(mine)
	stopped := fleet.Run(c.Context, mine, r.plan, func(ctx context.Context, t fleet.Target) fleet.Entry {
		return a.fleetTarget(ctx, r, t)
	}, func(e fleet.Entry) { a.fleetRecord(r, e) })
	for _, why := range stopped {
		if err := r.ledger.Stop(why); err != nil {
			fmt.Fprintf(a.Stderr, "pgflow-upgrade fleet %s: %v\n", command, err)
		}
	}
	entries, stops := r.ledger.Snapshot()
	mineRefs := fleet.Refs(mine)
	if shard.N > 1 {
		fmt.Fprintf(a.Stderr, "pgflow-upgrade fleet %s: shard %s: %d of the %d targets (merge the shards' ledgers with `pgflow-upgrade fleet report`)\n",
			command, shard, len(mine), len(all))
	}
	return a.finishFleet(c, fleet.Build(command, mineRefs, entries, stops))
}

// passArgs are the single command's flags the user set, as arguments.
func passArgs(c *ucli.Context, names []string) []string {
	var out []string
	for _, n := range names {
		if !c.IsSet(n) {
			continue
		}
		if vs := c.StringSlice(n); len(vs) > 0 {
			for _, v := range vs {
				out = append(out, "--"+n+"="+v)
			}
			continue
		}
		out = append(out, fmt.Sprintf("--%s=%v", n, c.Value(n)))
	}
	return out
}

// readTargets reads and checks the targets file ("-": standard input),
// and warns when it holds passwords others may read.
func (a *App) readTargets(path string) ([]fleet.Target, error) {
	if path == "-" {
		ts, err := fleet.ParseTargets(a.Stdin, "standard input")
		return ts, withCode(ExitUsage, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("--targets: %w", err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("--targets: %w", err))
	}
	if !fi.Mode().IsRegular() && fi.Mode()&os.ModeNamedPipe == 0 {
		return nil, usageErrorf("--targets %s: not a regular file", path)
	}
	ts, err := fleet.ParseTargets(f, path)
	if err != nil {
		return nil, withCode(ExitUsage, err)
	}
	if w := fleet.ExposedPasswords(ts, fi.Mode(), path); w != "" {
		fmt.Fprintln(a.Stderr, "pgflow-upgrade: "+w)
	}
	return ts, nil
}

// fleetRecord writes e to the ledger and, when it is an outcome, says so
// on stderr as the run goes (one line a target: a pipeline log shows the
// fleet moving).
func (a *App) fleetRecord(r *fleetRun, e fleet.Entry) {
	if err := r.ledger.Record(e); err != nil {
		fmt.Fprintf(a.Stderr, "pgflow-upgrade fleet %s: %v\n", r.command, err)
	}
	if e.Status == fleet.StatusRunning || e.Status == fleet.StatusNotStarted {
		return
	}
	r.progress.Lock()
	defer r.progress.Unlock()
	r.done++
	took := ""
	if e.StartedAt != nil && e.FinishedAt != nil {
		took = " in " + e.FinishedAt.Sub(*e.StartedAt).Round(10*time.Millisecond).String()
	}
	fmt.Fprintf(a.Stderr, "fleet %s [%d/%d] %s: %s (exit %d)%s\n", r.command, r.done, r.todo, e.Name, e.Verdict, e.ExitCode, took)
}

// finishFleet prints the report as asked and returns its exit code.
func (a *App) finishFleet(c *ucli.Context, rep *fleet.Report) error {
	var err error
	switch c.String("format") {
	case "json":
		err = writeJSON(a.Stdout, rep)
	case "markdown":
		err = rep.Markdown(a.Stdout)
	default:
		err = writeFleetTable(a.Stdout, rep)
	}
	if err != nil {
		return err
	}
	if path := c.String("junit"); path != "" {
		if err := writeFleetJUnit(path, rep); err != nil {
			return withCode(ExitEnvironment, err)
		}
	}
	if rep.ExitCode == ExitOK {
		return nil
	}
	return reportedError{withCode(rep.ExitCode, fmt.Errorf("fleet %s: %s", rep.Command, rep.Verdict))}
}

func writeFleetJUnit(path string, rep *fleet.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	if err := rep.JUnit(f); err != nil {
		f.Close()
		return fmt.Errorf("--junit: %w", err)
	}
	return f.Close()
}

// writeFleetTable prints the verdict line, one table per state group, and
// the targets that gave no answer.
func writeFleetTable(w io.Writer, rep *fleet.Report) error {
	fmt.Fprintln(w, rep.HeadLine())
	for _, s := range rep.Stopped {
		writeBlock(w, "stopped: ", s, 2)
	}
	for _, g := range rep.Groups {
		fmt.Fprintln(w)
		writeBlock(w, g.Title()+": ", g.Describe(), 2)
		var rows [][]string
		for _, name := range g.Targets {
			rows = append(rows, rep.Row(rep.Entry(name)))
		}
		if err := writeTable(w, rep.Header(), rows); err != nil {
			return err
		}
	}
	if len(rep.Unreached) > 0 {
		fmt.Fprintf(w, "\nno answer from %s:\n", plural(len(rep.Unreached), "target", "targets"))
		var rows [][]string
		for _, name := range rep.Unreached {
			rows = append(rows, fleet.UnreachedRow(rep.Entry(name)))
		}
		if err := writeTable(w, fleet.UnreachedHeader(), rows); err != nil {
			return err
		}
	}
	return nil
}
