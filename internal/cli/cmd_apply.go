package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

const applyDescription = `Upgrades real pgflow 0.16.0 to upstream pgflow's 0.17.0 schema (private step
queues, queue identity on steps and step_tasks, the 5-argument start_tasks) in ONE
transaction on ONE connection:

  1. integrity: the embedded migration is checked against atlas.sum (tampered: refuse);
     with --supabase-dir, the user's copy of pgflow's 0.17.0 migration is found there;
  2. advisory lock: pg_try_advisory_xact_lock(8099555070895812711), polled with backoff
     for up to --wait; a second apply exits with "another pgflow-upgrade apply is running"
     (transaction-level, so it works through pgbouncer/Supavisor in transaction mode);
     only then SET LOCAL lock_timeout = --lock-timeout;
  3. state: already pgflow 0.17.0 (by this tool or by pgflow's own migration) -> a no-op
     that says so; anything but 0.16.0 -> refuse; an apply --quiesce killed before its
     restore, or an unfinished apply --online -> refuse, naming the two commands that
     finish or undo it (--resume-quiesce / --undo-quiesce, --online / --rollback-online);
  4. table locks in the fixed order
       flows, steps (ACCESS EXCLUSIVE) -> deps -> runs -> step_states (EXCLUSIVE)
       -> step_tasks (ACCESS EXCLUSIVE) -> workers (EXCLUSIVE)
     each attempt bounded by --lock-timeout (default 2s); on a timeout everything taken
     so far is released (rollback to a savepoint), then retried up to --lock-retries
     times (default 5) with exponential backoff from 200ms (x2 per retry, at most 5s,
     with jitter). The application is never blocked longer than one lock timeout per
     attempt. After the last attempt: exit 1, naming the table and the blocking pids;
  5. preflight: the audit's preflight checks, exact, under those locks; any blocker:
     roll back, print the findings, exit 1, nothing changed;
  6. the migration, statement by statement; 7. post-conditions (as verify: the catalog
     is pgflow 0.17.0's, the 0.16.0 claim is gone);
  8. the revision is recorded in pgflow_upgrade.schema_revisions; with --supabase-dir,
     pgflow's 0.17.0 migration is recorded as applied in supabase_migrations.schema_migrations
     (without it, apply prints the supabase migration repair command to run);
  9. commit (--dry-run: roll back, report per-step timings and the lock window).

From any other release (0.14.1, 0.15.x, 0.17.0, 0.17.1) and to --to RELEASE (default
upstream's newest, ` + versions.Newest + `) apply follows a plan of hops in the same transaction:
this tool's migration for 0.16.0 -> 0.17.0, upstream's own files for every other hop, read
from your copy (--pgflow-migrations DIR, default --supabase-dir) and recognised by their
atlas.sum hash whatever their names (one missing or changed: exit 1 naming it, nothing
changed); each file is recorded in the Supabase ledger as supabase db push would. 0.17.1's
indexes are built CONCURRENTLY and 0.15.1's CHECK validated before the transaction. Without
upstream's files the plan ends at 0.17.0 and says what the rest needs. 0.17.1 schedules
pgflow's daily telemetry job; --telemetry off opts out (pgflow_telemetry.disable(), same
transaction). See docs/releases.md.
Any failure or interruption rolls back everything. Without --yes, apply asks for
confirmation on a terminal and refuses (exit 2) when not on one.
--online: the same upgrade without blocking the application (expand, batched and
resumable backfill, contract, then the steps above in one short switch transaction);
--rollback-online undoes an unfinished one. See docs/online.md.
--pgmq VERSION: pgmq's own update as a hop of the same plan, after the pgflow hop (in
the same transaction from 0.16.0, alone on 0.17): the target must be offered by the
server (pg_available_extension_versions) and is not 1.10.0/1.10.1; pgmq.meta (EXCLUSIVE)
and every queue and archive table by name (ACCESS EXCLUSIVE) join the lock order above,
with the same bounds and retries; mixed-case pgmq.meta names (the pgmq update fails on
them) are renamed to their tables' lower case; ALTER EXTENSION pgmq UPDATE; the claim path
(read, read_with_poll, pop, set_vt) of every queue is called before the commit, in a
savepoint rolled back, and read/set_vt again after it. With --dry-run all of it is
rolled back. See docs/runbook.md, "The pgmq hop".
Exit codes: 0 applied / already applied / dry run, 1 refused (blockers, tampered,
lock not obtained, wrong state), 2 usage, 3 connection, 4 a preflight check ran
out of time, 130 interrupted.`

func (a *App) applyCommand() *ucli.Command {
	return &ucli.Command{
		Name:        "apply",
		Usage:       "upgrade the database from pgflow 0.16.0 to 0.17.0 in one guarded transaction",
		Description: applyDescription,
		Flags: append([]ucli.Flag{
			&ucli.BoolFlag{Name: "yes", Usage: "do not ask for confirmation (pipelines)"},
			&ucli.BoolFlag{Name: "dry-run", Usage: "run everything, then roll back; report timings and the lock window (takes the same locks!)"},
			&ucli.DurationFlag{Name: "wait", Value: upgrade.DefaultWait, Usage: "how long to wait for another apply's advisory lock (0: do not wait)"},
			&ucli.DurationFlag{Name: "lock-timeout", Value: upgrade.DefaultLockTimeout, Usage: "lock_timeout of each table-lock attempt (and every later lock wait)"},
			&ucli.IntFlag{Name: "lock-retries", Value: upgrade.DefaultLockRetries, Usage: "table-lock attempts after the first"},
			&ucli.IntFlag{Name: "sample", Value: 5, Usage: "sample rows per preflight finding"},
			&ucli.StringFlag{Name: "supabase-dir", Usage: "the project's supabase/migrations folder: record pgflow's own 0.17.0 migration (*_pgflow_private_step_queues.sql) there as applied in the Supabase ledger"},
			&ucli.StringFlag{Name: "to", Usage: "the release to end at: 0.17.0 (this tool's own hop only), 0.17.1 or " + versions.Newest + " (default: upstream's newest, " + versions.Newest + ")"},
			&ucli.StringFlag{Name: "pgflow-migrations", Usage: "the folder holding your copy of pgflow's own migration files (recognised by their atlas.sum hash, whatever their names; default: --supabase-dir); without them the plan ends at 0.17.0 and says what the rest needs"},
			&ucli.StringFlag{Name: "telemetry", Usage: "off: opt out of pgflow's daily telemetry job (upstream's pgflow_telemetry.disable(), in the same transaction) when the plan reaches 0.17.1; default: upstream's (the job stays scheduled)"},
			&ucli.DurationFlag{Name: "check-timeout", Value: 30 * time.Second, Usage: "statement_timeout of each preflight check (they run exact, under the locks; a check that runs out: exit 4, nothing changed)"},
			&ucli.StringFlag{Name: "pgmq", Usage: "also update pgmq to `VERSION` (e.g. 1.13.1) after the pgflow hop, in the same transaction (alone when pgflow is 0.17 already): " +
				"the server must offer it (pg_available_extension_versions), 1.10.0/1.10.1 are refused, mixed-case pgmq.meta names are made to match their tables first, " +
				"pgmq.meta and every queue table are locked in order with the same bounds, and the claim path of every queue is checked before and after the commit"},
		}, append(onlineFlags(), quiesceFlags()...)...),
		Action: a.applyAction,
	}
}

func (a *App) applyAction(c *ucli.Context) error {
	if c.NArg() > 0 {
		return usageErrorf("apply takes no arguments (got %q)", c.Args().Slice())
	}
	if err := checkQuiesceFlags(c); err != nil { // cmd_apply_quiesce.go
		return err
	}
	if c.Bool("undo-quiesce") {
		return a.undoQuiesceAction(c)
	}
	if c.String("pgmq") != "" {
		if c.Bool("online") || c.Bool("rollback-online") {
			return usageErrorf("--pgmq runs with the transactional apply: run apply --online first, then apply --pgmq VERSION")
		}
		if _, err := pgmqver.Parse(c.String("pgmq")); err != nil {
			return usageErrorf("--pgmq: %v", err)
		}
	}
	if c.Bool("online") || c.Bool("rollback-online") {
		return a.applyOnlineAction(c) // cmd_apply_online.go
	}
	if c.Duration("lock-timeout") <= 0 || c.Duration("check-timeout") <= 0 || c.Int("lock-retries") < 0 || c.Duration("wait") < 0 {
		return usageErrorf("--lock-timeout and --check-timeout must be positive, --lock-retries and --wait not negative")
	}
	telemetryOff, err := telemetryFlag(c)
	if err != nil {
		return err
	}
	if err := toFlag(c); err != nil {
		return err
	}
	yes, dry := c.Bool("yes"), c.Bool("dry-run")
	if !yes && !a.Interactive {
		return usageErrorf("apply changes the database and locks the pgflow tables: pass --yes (pipelines), or run it on a terminal to confirm")
	}
	ctx := c.Context
	conn, t, err := a.openTarget(c, "apply")
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	where := session.Describe(t.config)
	if err := applyPrecheck(ctx, conn); err != nil { // envcheck.go: a standby, a read-only default
		return withCode(ExitEnvironment, fmt.Errorf("apply on %s: %w", where, err))
	}

	if !yes {
		// Ask only when there is something to do: a quick read-only look.
		st, err := upgrade.Status(ctx, conn)
		if err != nil {
			return withCode(ExitEnvironment, fmt.Errorf("reading the schema state of %s: %w", where, err))
		}
		if pgmqTo := c.String("pgmq"); pgmqTo != "" && st.State.State == versions.SchemaUpgraded {
			what := "UPDATE pgmq to " + pgmqTo + " on"
			if dry {
				what = "DRY-RUN (then roll back) the pgmq update to " + pgmqTo + " on"
			}
			fmt.Fprintf(a.Stderr, "About to %s %s.\nThis locks pgmq.meta and every queue table (ACCESS EXCLUSIVE) until it commits.\nType yes to continue: ", what, where)
			line, _ := bufio.NewReader(a.Stdin).ReadString('\n')
			if strings.TrimSpace(line) != "yes" {
				fmt.Fprintln(a.Stderr, "not confirmed: nothing was done")
				return reportedError{withCode(ExitFindings, errors.New("not confirmed"))}
			}
		}
		if st.State.State == versions.SchemaBaseline {
			what := "UPGRADE"
			if dry {
				what = "DRY-RUN (then roll back) the upgrade of"
			}
			fmt.Fprintf(a.Stderr, "About to %s %s: pending %s.\nThis locks the pgflow tables (step_tasks ACCESS EXCLUSIVE) for the duration of the migration.\nStop the 0.16.0 workers first. Type yes to continue: ",
				what, where, strings.Join(st.Pending, ", "))
			line, _ := bufio.NewReader(a.Stdin).ReadString('\n')
			if strings.TrimSpace(line) != "yes" {
				fmt.Fprintln(a.Stderr, "not confirmed: nothing was done")
				return reportedError{withCode(ExitFindings, errors.New("not confirmed"))}
			}
		}
	}

	opts := upgrade.Options{
		DryRun:      dry,
		Wait:        c.Duration("wait"),
		LockTimeout: c.Duration("lock-timeout"),
		LockRetries: c.Int("lock-retries"),
		Preflight:   audit.Options{Sample: c.Int("sample"), CheckTimeout: c.Duration("check-timeout")},
		SupabaseDir: c.String("supabase-dir"),
		Quiesce:     a.quiesceOptions(c, quiesce.ModeApply),

		To:               c.String("to"),
		PgflowMigrations: c.String("pgflow-migrations"),
		TelemetryOff:     telemetryOff,
		PGMQ:             c.String("pgmq"),
	}
	prog := a.newProgress() // progress.go: on a terminal and off it
	opts.Progress = prog.event
	res, err := upgrade.Apply(ctx, conn, opts)
	prog.stop()
	if env := a.diagnoseDuring(ctx, t, err, lastStep(res.Report) == upgrade.StepMigrate); env != nil {
		// The environment stopped it (failure.go, envcheck.go): say what
		// happened, what it left and what to do, and no next step that
		// would fail the same way.
		err = env
		res.Message = env.Error() + "; " + applyLeft(res.Report, env)
		res.Report.PgflowVersion = withNextStep(res.Report.PgflowVersion, env.nextStep("apply"))
	}
	return finishRun(a, c, "apply", where, res, err, func(w io.Writer) error { return writeApplyTable(w, where, res) })
}

// telemetryFlag reads --telemetry: "off" opts out, "" or "on" keeps
// upstream's default.
func telemetryFlag(c *ucli.Context) (off bool, err error) {
	switch v := c.String("telemetry"); v {
	case "", "on":
		return false, nil
	case "off":
		return true, nil
	default:
		return false, usageErrorf("--telemetry takes off (opt out) or on (upstream's default), not %q", v)
	}
}

// toFlag checks --to: a release apply ends at, 0.17.0 or later.
func toFlag(c *ucli.Context) error {
	if !c.IsSet("to") {
		return nil
	}
	r, err := versions.LookupRelease(c.String("to"))
	if err != nil {
		return usageErrorf("--to: %v", err)
	}
	if least, _ := versions.LookupRelease(versions.R0_17_0); r.Files < least.Files {
		return usageErrorf("--to %s: apply upgrades to 0.17.0 or later (0.17.0, 0.17.1, %s)", r.Name, versions.Newest)
	}
	return nil
}

// writePlan prints the plan hop by hop.
func writePlan(w io.Writer, p *upgrade.Plan) {
	if p == nil {
		return
	}
	fmt.Fprintf(w, "plan: %s -> %s (%d hops, upstream's newest release is %s)\n", p.From, p.To, len(p.Hops), versions.Newest)
	for _, l := range p.Lines() {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// writeApplyTable prints the outcome, blockers, failed post-conditions,
// statements (dry run) and step timings.
func writeApplyTable(w io.Writer, where string, res *outcome.Result[*upgrade.Report]) error {
	rep := res.Report
	fmt.Fprintf(w, "pgflow-upgrade apply on %s: %s\n%s\n", where, res.Outcome, res.Message)
	if rep.VersionNow != "" { // applied: what was found before is no longer true
		was := "?"
		if rep.PgflowVersion != nil {
			was = rep.PgflowVersion.Found
		}
		fmt.Fprintf(w, "pgflow version: was %s, now %s\nnext step: %s\n", was, rep.VersionNow, rep.NextStep)
	} else {
		writeVersion(w, rep.PgflowVersion)
	}
	writePlan(w, rep.Plan)
	if len(rep.Blockers) > 0 {
		if err := writeBlockers(w, rep.Blockers); err != nil {
			return err
		}
		if err := writeFindingSamples(w, rep.Blockers, func(f audit.Finding) string { return f.CheckID }); err != nil {
			return err
		}
	}
	// Warnings do not stop the upgrade, but the operator should see them
	// (e.g. 0.16.0 workers still alive, a queue that is not pgflow's).
	var warns []audit.Finding
	for _, r := range rep.Preflight {
		for _, f := range r.Findings {
			if f.Severity == audit.Warning {
				warns = append(warns, f)
			}
		}
	}
	if len(warns) > 0 {
		fmt.Fprintln(w, "\nwarnings (not blocking):")
		if err := writeFindings(w, warns); err != nil {
			return err
		}
	}
	var unproven [][]string
	for _, r := range rep.Preflight {
		if r.Status == audit.StatusError || r.Status == audit.StatusInconclusive {
			unproven = append(unproven, []string{r.ID, string(r.Status), r.Error})
		}
	}
	if len(unproven) > 0 {
		fmt.Fprintln(w, "\npreflight checks without an answer:")
		if err := writeTable(w, []string{"check", "status", "error"}, unproven); err != nil {
			return err
		}
	}
	if bad := upgrade.Failed(rep.PostConditions); len(bad) > 0 {
		fmt.Fprintln(w, "\nfailed post-conditions (rolled back):")
		var rows [][]string
		for _, o := range bad {
			rows = append(rows, []string{o.ID, o.Title, o.Detail})
		}
		if err := writeTable(w, []string{"check", "condition", "detail"}, rows); err != nil {
			return err
		}
	}
	if rep.DryRun && len(rep.Statements) > 0 {
		fmt.Fprintln(w, "\nwhat would change (statements, rows affected, time):")
		var rows [][]string
		for _, s := range rep.Statements {
			rows = append(rows, []string{fmt.Sprint(s.Index), s.Summary, fmt.Sprint(s.Rows), fmt.Sprint(s.DurationMS)})
		}
		if err := writeTable(w, []string{"#", "statement", "rows", "ms"}, rows); err != nil {
			return err
		}
	}
	if len(rep.Steps) > 0 {
		fmt.Fprintln(w)
		var rows [][]string
		for _, s := range rep.Steps {
			rows = append(rows, []string{s.Step, fmt.Sprint(s.DurationMS), s.Detail})
		}
		if err := writeTable(w, []string{"step", "ms", "detail"}, rows); err != nil {
			return err
		}
	}
	if rep.LockAttempts > 0 && res.Outcome == outcome.LockBusy {
		fmt.Fprintf(w, "tables not locked: %d lock attempt(s), %d ms waiting in them; total %d ms\n", rep.LockAttempts, rep.LockWaitMS, rep.TotalMS)
	} else if rep.LockAttempts > 0 {
		fmt.Fprintf(w, "lock window %d ms (first LOCK to %s), %d lock attempt(s), %d ms waiting in failed attempts; total %d ms\n",
			rep.LockWindowMS, map[bool]string{true: "rollback", false: "commit/rollback"}[rep.DryRun], rep.LockAttempts, rep.LockWaitMS, rep.TotalMS)
	}
	if rep.Supabase != "" {
		fmt.Fprintf(w, "supabase: %s\n", rep.Supabase)
	}
	writePGMQHop(w, rep.PGMQ)
	writeQuiesce(w, rep.Quiesce)
	return nil
}

// lastStep is the step apply was in when it stopped ("" before the first).
func lastStep(rep *upgrade.Report) string {
	if len(rep.Steps) == 0 {
		return ""
	}
	return rep.Steps[len(rep.Steps)-1].Step
}

// applyLeft says what an apply the environment stopped left in the
// database. A session lost during COMMIT may have committed or not: only
// the server knows, and status reads it.
func applyLeft(rep *upgrade.Report, env *envError) string {
	switch {
	case env.lost && lastStep(rep) == upgrade.StepCommit:
		return "the session was lost during COMMIT, so whether the upgrade committed is not known here: `pgflow-upgrade status` says (pgflow 0.17.0: it did; 0.16.0: it did not, nothing was changed)"
	case rep.Quiesce != nil:
		return "the upgrade's transaction was rolled back (what --quiesce changed and restored is below; `pgflow-upgrade status` shows a quiesce still recorded)"
	}
	return "the transaction was rolled back: nothing was changed"
}

// withNextStep is a copy of d whose next step is step (d nil: nil).
func withNextStep(d *versions.Detection, step string) *versions.Detection {
	if d == nil {
		return nil
	}
	c := *d
	c.NextStep = step
	return &c
}

// writePGMQHop prints what the pgmq hop did (apply --pgmq).
func writePGMQHop(w io.Writer, p *upgrade.PGMQReport) {
	if p == nil {
		return
	}
	if p.NothingToDo {
		fmt.Fprintf(w, "pgmq: already at %s\n", p.To)
		return
	}
	fmt.Fprintf(w, "pgmq: %s -> %s, %d queue(s), the update itself %d ms; claim path checked on %d queue(s) before the commit, %d after\n",
		p.From, p.To, p.Queues, p.UpdateMS, p.ClaimChecked, p.ClaimCheckedAfter)
	if len(p.Locked) > 0 {
		fmt.Fprintf(w, "pgmq locks, in order: %s\n", strings.Join(p.Locked, ", "))
	}
	for _, r := range p.Repairs {
		fmt.Fprintf(w, "pgmq.meta %q (table %s): %s\n", r.Queue, r.Table, r.Action)
	}
}
