package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func (a *App) auditCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "audit",
		Usage: "read-only pre-upgrade audit with exact counts (safe on production)",
		Description: "Runs the check catalog, each check in its own READ ONLY transaction with its own time budget.\n" +
			"Exit codes: 0 no blockers, 1 blockers found, 4 inconclusive (a check timed out or failed; no blockers), 3 connection error.\n" +
			"Checks: " + strings.Join(audit.IDs(), ", ") + "\n" +
			"Forecast: the expected lock window of a transactional apply and the duration of apply --online, from row counts in the statistics (no scan)\n" +
			"and per-row costs from --calibration FILE or measured on a generated sample (--calibrate-dsn, --calibrate-local); it never changes the exit code.",
		Flags: append([]ucli.Flag{
			&ucli.IntFlag{Name: "sample", Value: 5, Usage: "sample rows per finding (0: none)"},
			&ucli.StringSliceFlag{Name: "check", Usage: "run only this check `ID` (repeatable)"},
			&ucli.Int64Flag{Name: "bound", Value: 500_000, Usage: "rows per query of the chunked duplicate scan (how finely an out-of-time check reports \"examined N\"); counts are always exact"},
			&ucli.DurationFlag{Name: "check-timeout", Value: 60 * time.Second, Usage: "time budget of each check (statement_timeout); a check out of budget is inconclusive (exit 4)"},
			&ucli.DurationFlag{Name: "timeout", Value: 180 * time.Second, Usage: "time budget of the whole audit"},
			&ucli.DurationFlag{Name: "lock-timeout", Value: time.Second, Usage: "lock_timeout: the longest a check waits for a lock"},
			&ucli.BoolFlag{Name: "verbose", Usage: "also every finding's samples, the inventories, the per-check timing table and the forecast's details (JSON always has all)"},
		}, forecastFlags()...),
		Action: a.auditAction,
	}
}

func (a *App) auditAction(c *ucli.Context) error {
	if c.NArg() > 0 {
		return usageErrorf("audit takes no arguments (got %q); use --check ID to select checks", c.Args().Slice())
	}
	ids := c.StringSlice("check")
	for _, id := range ids {
		if _, err := audit.Lookup(id); err != nil {
			return withCode(ExitUsage, err)
		}
	}
	sample := c.Int("sample")
	if sample < 0 {
		return usageErrorf("--sample %d: must be 0 or more", sample)
	}
	if sample == 0 {
		sample = -1 // audit.Options: negative means none, 0 the default
	}
	if c.Int64("bound") < 1 {
		return usageErrorf("--bound %d: must be at least 1", c.Int64("bound"))
	}
	for _, f := range []string{"check-timeout", "timeout", "lock-timeout"} {
		if c.Duration(f) <= 0 {
			return usageErrorf("--%s %s: must be positive", f, c.Duration(f))
		}
	}
	plan, err := parseForecastFlags(c)
	if err != nil {
		return err
	}
	ctx := c.Context
	conn, t, err := a.openTarget(c, "audit")
	if err != nil {
		return err
	}
	a.noteSameServer(plan, t)
	defer conn.Close(context.WithoutCancel(ctx))

	rep, err := audit.Run(ctx, conn, audit.Options{
		Sample:          sample,
		Checks:          ids,
		Bound:           c.Int64("bound"),
		CheckTimeout:    c.Duration("check-timeout"),
		TotalTimeout:    c.Duration("timeout"),
		LockTimeout:     c.Duration("lock-timeout"),
		ApplicationName: "pgflow-upgrade audit",
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return withCode(ExitEnvironment, fmt.Errorf("audit of %s: %w", session.Describe(t.config), err))
	}
	code := auditExitCode(rep)
	var newer []string
	if tx, err := session.BeginReadOnly(ctx, conn, 10*time.Second, time.Second, "pgflow-upgrade audit"); err == nil {
		// A revision a newer pgflow-upgrade recorded: apply refuses, so the
		// verdict and the next step say so (a role that cannot read the
		// table is told by apply).
		newer, _ = upgrade.NewerRevisions(ctx, tx)
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}
	if len(newer) > 0 {
		rep.PgflowVersion = withNextStep(rep.PgflowVersion, upgrade.NewerNextStep(newer))
		code = ExitFindings // apply refuses, as it does for a blocker
	}
	fc := a.runForecast(ctx, conn, rep, plan, c.Duration("check-timeout"), c.Duration("lock-timeout"))
	if ctx.Err() != nil {
		return ctx.Err()
	}

	var buf bytes.Buffer
	if jsonOutput(c) {
		sum := summarize(rep, code)
		sum.Verdict = auditVerdict(code, rep.PgflowVersion, newer)
		err = writeJSON(&buf, auditJSON{Target: session.Describe(t.config), Report: rep, Summary: sum, Forecast: fc})
	} else {
		err = writeAuditTableOf(&buf, session.Describe(t.config), rep, fc, code, c.Bool("verbose"), newer)
	}
	if err != nil {
		return err
	}
	// Nothing we print comes from the DSN's password, but make sure.
	if _, err := a.Stdout.Write([]byte(a.redact(buf.String()))); err != nil {
		return err
	}
	switch code {
	case ExitFindings:
		return withCode(code, reportedError{errors.New("blockers found")})
	case ExitInconclusive:
		return withCode(code, reportedError{errors.New("inconclusive")})
	}
	return nil
}

// auditExitCode: blockers 1, else inconclusive/errored checks 4, else 0.
func auditExitCode(rep *audit.Report) int {
	switch {
	case rep.Blockers() > 0:
		return ExitFindings
	case rep.Inconclusive() > 0 || rep.Errors() > 0:
		return ExitInconclusive
	}
	return ExitOK
}

// auditJSON is the --format json document (docs/audit.md).
type auditJSON struct {
	Target  string       `json:"target"`
	Summary auditSummary `json:"summary"`
	*audit.Report
	// Forecast: the expected cost of the upgrade on this database.
	Forecast *forecast.Forecast `json:"forecast"`
}

type auditSummary struct {
	Blockers     int `json:"blockers"`
	Warnings     int `json:"warnings"`
	Info         int `json:"info"`
	Inconclusive int `json:"inconclusive"`
	Errors       int `json:"errors"`
	Skipped      int `json:"skipped"`
	ExitCode     int `json:"exit_code"`
	// Verdict is the first line's word(s): GO only where plain apply starts
	// from the database (auditVerdict).
	Verdict string `json:"verdict,omitempty"`
}

func summarize(rep *audit.Report, code int) auditSummary {
	s := auditSummary{ExitCode: code}
	for _, r := range rep.Checks {
		switch r.Status {
		case audit.StatusInconclusive:
			s.Inconclusive++
		case audit.StatusError:
			s.Errors++
		case audit.StatusSkipped:
			s.Skipped++
		}
		for _, f := range r.Findings {
			switch f.Severity {
			case audit.Blocker:
				s.Blockers++
			case audit.Warning:
				s.Warnings++
			default:
				s.Info++
			}
		}
	}
	return s
}

func severityRank(s audit.Severity) int {
	switch s {
	case audit.Blocker:
		return 0
	case audit.Warning:
		return 1
	}
	return 2
}

// auditVerdict is the audit's answer in a word: GO (no blockers, every
// check decided, and the plain apply its next step names goes through),
// NO-GO (blockers) or CANNOT TELL (a check ran out of time or failed).
// With no blockers on a database plain apply does not start from, the
// first line says what the database is instead of a bare GO, so that it
// never contradicts the next step below it.
func auditVerdict(code int, d *versions.Detection, newer []string) string {
	switch {
	case len(newer) > 0:
		return "NO-GO for this pgflow-upgrade (a newer one upgraded this database further)"
	case code == ExitFindings:
		return "NO-GO"
	case code == ExitInconclusive:
		return "CANNOT TELL"
	case d == nil || d.State == versions.StateReady:
		return "GO"
	case d.State == versions.StateOnline:
		return "GO for `apply --online` only (an online upgrade is half done: plain apply refuses)"
	case d.PlanStarts():
		// A release on the road to upstream's newest: apply takes it there.
		return "GO to " + d.Release.Newest + " (" + d.Summary() + "; apply runs upstream's files from your copy, --pgflow-migrations)"
	case d.State == versions.StateUpgraded:
		return "ALREADY UPGRADED (" + d.Summary() + ")"
	}
	return "NOT READY (" + d.Summary() + ")"
}

// auditNextStep is what to do after this audit: from its verdict on a
// 0.16.0 database, else the detection's next step, never "run audit".
func auditNextStep(rep *audit.Report, s auditSummary, code int, newer []string) string {
	d := rep.PgflowVersion
	if d != nil && (d.State != versions.StateReady || d.Quiesce != nil || len(newer) > 0) {
		// What the database is decides: an open quiesce's blocker is
		// resolved by the resume or undo its next step names.
		return withoutSelf(d.NextStep, "audit")
	}
	switch code {
	case ExitFindings:
		return fmt.Sprintf("resolve the %s below (each names its remedy): apply refuses while any remains", plural(s.Blockers, "blocker", "blockers"))
	case ExitInconclusive:
		return fmt.Sprintf("%s below could not decide: rerun where %s can finish (the time or grants named), or let apply's own preflight decide under its locks",
			plural(s.Inconclusive+s.Errors, "check", "checks"), map[bool]string{true: "it", false: "they"}[s.Inconclusive+s.Errors == 1])
	}
	if s.Warnings > 0 {
		return fmt.Sprintf("read the %s below, then run `pgflow-upgrade apply`", plural(s.Warnings, "warning", "warnings"))
	}
	return "run `pgflow-upgrade apply`"
}

// writeAuditTable prints, for a person on call: the verdict with its counts
// on the first line, the version and the next step; every blocker and
// warning in full with its remedy and samples; every check that could not
// decide with why; then one line per informational finding and a line of
// forecast. With verbose it adds everything else: the findings' table, the
// samples of every finding, the per-check timing table and the forecast's
// details.
func writeAuditTable(w *bytes.Buffer, target string, rep *audit.Report, fc *forecast.Forecast, code int, verbose bool) error {
	return writeAuditTableOf(w, target, rep, fc, code, verbose, nil)
}

// writeAuditTableOf is writeAuditTable on a database where a newer
// pgflow-upgrade recorded the revisions newer.
func writeAuditTableOf(w *bytes.Buffer, target string, rep *audit.Report, fc *forecast.Forecast, code int, verbose bool, newer []string) error {
	s := summarize(rep, code)
	fmt.Fprintf(w, "%s: %s, %s, %d cannot tell (exit %d)\n", auditVerdict(code, rep.PgflowVersion, newer),
		plural(s.Blockers, "blocker", "blockers"), plural(s.Warnings, "warning", "warnings"), s.Inconclusive+s.Errors, code)
	writeBlock(w, "pgflow version: ", versionSummary(rep.PgflowVersion)+"; next step: "+auditNextStep(rep, s, code, newer), 2)
	server := rep.ServerVersion
	if !verbose {
		server, _, _ = strings.Cut(server, " ") // "15.18 (Debian 15.18-0+deb12u1)": the number is enough here
	}
	writeBlock(w, "audit of ", fmt.Sprintf("%s: PostgreSQL %s, pgmq %s, schema %s; %d checks in %d ms",
		target, server, rep.PGMQ, rep.Schema.State, len(rep.Checks), rep.DurationMS), 2)

	var findings []audit.Finding
	for _, r := range rep.Checks {
		findings = append(findings, r.Findings...)
	}
	// Stable: by severity, then catalog order (the order of rep.Checks).
	sort.SliceStable(findings, func(i, j int) bool {
		return severityRank(findings[i].Severity) < severityRank(findings[j].Severity)
	})
	var info []audit.Finding
	for _, f := range findings {
		if f.Severity != audit.Blocker && f.Severity != audit.Warning {
			info = append(info, f)
			continue
		}
		fmt.Fprintln(w)
		writeBlock(w, fmt.Sprintf("%s %s (%s): ", strings.ToUpper(string(f.Severity)), f.CheckID, countCell(f)), withoutSelf(f.Message, "audit"), 2)
		writeBlock(w, "  remedy: ", withoutSelf(f.Remedy, "audit"), 4)
		for _, sm := range f.Samples {
			fmt.Fprintln(w, "  "+oneLine("e.g. "+sampleText(sm), lineWidth-2))
		}
	}
	for _, r := range rep.Checks {
		if r.Status != audit.StatusInconclusive && r.Status != audit.StatusError {
			continue
		}
		why := r.Error
		if r.Coverage != nil && !strings.Contains(why, r.Coverage.String()) {
			why += "; " + r.Coverage.String()
		}
		fmt.Fprintln(w)
		writeBlock(w, fmt.Sprintf("CANNOT TELL %s (%s): ", r.ID, r.Status), r.Title+": "+why, 2)
	}

	if !verbose {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "%s (--verbose: samples, inventories, check timings, forecast details):\n", plural(len(info), "informational finding", "informational findings"))
		for _, f := range info {
			fmt.Fprintln(w, "  "+oneLine(f.CheckID+": "+withoutSelf(f.Message, "audit"), lineWidth-2))
		}
		for _, r := range rep.Checks {
			if r.Status == audit.StatusSkipped {
				fmt.Fprintln(w, "  "+oneLine("skipped "+r.ID+": "+r.Error, lineWidth-2))
			}
		}
		writeForecastLine(w, fc)
		return nil
	}
	// --verbose: the informational findings are rows of the findings'
	// table, the skipped checks rows of the checks' table.

	fmt.Fprintln(w)
	if len(findings) == 0 {
		fmt.Fprintln(w, "no findings")
	} else {
		var rows [][]string
		for _, f := range findings {
			rows = append(rows, append([]string{string(f.Severity)}, findingRow(f)...))
		}
		if err := writeTable(w, append([]string{"severity"}, findingColumns...), rows); err != nil {
			return err
		}
	}
	if err := writeFindingSamples(w, findings, func(f audit.Finding) string {
		return fmt.Sprintf("%s %s: %s", f.Severity, f.CheckID, f.Message)
	}); err != nil {
		return err
	}

	fmt.Fprintln(w)
	var rows [][]string
	for _, r := range rep.Checks {
		rows = append(rows, []string{r.ID, string(r.Status), fmt.Sprint(len(r.Findings)), fmt.Sprint(r.DurationMS), r.Error})
	}
	if err := writeTable(w, []string{"check", "status", "findings", "ms", "note"}, rows); err != nil {
		return err
	}
	writeForecast(w, fc)
	fmt.Fprintf(w, "\n%d blocker(s), %d warning(s), %d inconclusive, %d error(s): exit %d\n",
		s.Blockers, s.Warnings, s.Inconclusive, s.Errors, code)
	return nil
}

// writeForecastLine is the forecast in one line (writeForecast has it all).
func writeForecastLine(w *bytes.Buffer, f *forecast.Forecast) {
	if f == nil {
		return
	}
	defer writeHopsLine(w, f.Hops)
	if !f.Available && len(f.Hops) > 0 && !hasOwnHop(f.Hops) {
		fmt.Fprintln(w, oneLine("forecast: no hop holds a lock for work that grows with the rows", lineWidth))
		return
	}
	if !f.Available {
		why, _, _ := strings.Cut(f.Reason, ": ")
		fmt.Fprintln(w, oneLine("forecast: unavailable: "+why+" (--verbose says how to get one)", lineWidth))
		return
	}
	text := "forecast: apply holds its locks about " + msText(f.LockWindowMS)
	if f.OnlineTotalMS != nil {
		text += ", apply --online takes about " + msText(*f.OnlineTotalMS)
	}
	if f.RecommendOnline {
		text += "; use --online"
	}
	fmt.Fprintln(w, oneLine(text, lineWidth))
}
