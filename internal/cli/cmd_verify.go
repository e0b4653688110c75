package cli

import (
	"errors"
	"fmt"
	"io"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/queueroutes"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func (a *App) verifyCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "verify",
		Usage: "after apply: schema pgflow is upstream's 0.17.0 and the 0.16.0 claim is gone; with --routes, every queue route has a live worker",
		Description: "Read-only catalog checks in a READ ONLY transaction: every table, column, constraint,\n" +
			"index, type and function (with its attributes) of pgflow 0.17.0's catalog present and\n" +
			"defined the same (0.17.1+'s when upstream's later migrations are applied; objects of your own\n" +
			"tolerated and named), the 0.16.0 " + versions.StartTasks016.String() + ",\n" +
			versions.EnsureFlowCompiled016.String() + " and pgflow._create_flow_from_shape(text, jsonb)\n" +
			"gone, no trigger on step_tasks.\n" +
			"--routes also reads every queue route (a flow-mode flow, or each step of a step-mode flow), its queue\n" +
			"and its live workers (not stopped or deprecated, heartbeat within 6 heartbeat intervals), only SELECTs\n" +
			"in one READ ONLY transaction with --check-timeout and --lock-timeout: a route fails when a message has\n" +
			"waited longer than --grace with no live worker, or when its only live workers are 0.16.0 workers.\n" +
			"Exit codes: 0 all pass, 1 any check or route failed, 3 connection error,\n" +
			"4 cannot tell (a route could not be read: privileges, a timeout).",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "routes", Usage: "also check that every queue route has a live worker that can claim"},
			&ucli.DurationFlag{Name: "grace", Usage: "with --routes: how long a message may wait on a route without a worker (default " +
				fmt.Sprint(queueroutes.GraceHeartbeats) + " heartbeat intervals)"},
			&ucli.DurationFlag{Name: "heartbeat-interval", Value: queueroutes.DefaultHeartbeatInterval, Usage: "with --routes: the workers' heartbeat interval (pgflow's default 5s); a worker is live within 6 of them"},
			&ucli.DurationFlag{Name: "check-timeout", Value: 30 * time.Second, Usage: "with --routes: statement_timeout of the route read; out of time is exit 4"},
			&ucli.DurationFlag{Name: "lock-timeout", Value: time.Second, Usage: "with --routes: lock_timeout: the longest the read waits for a lock"},
			&ucli.BoolFlag{Name: "verbose", Usage: "list every check and every route (JSON always has all)"},
		},
		Action: a.verifyAction,
	}
}

// routesResult is the --routes part of verify's document.
type routesResult struct {
	*queueroutes.Report
	// Error: why the routes could not be read (the answer is unknown).
	Error string `json:"error,omitempty"`
}

func (a *App) verifyAction(c *ucli.Context) error {
	for _, f := range []string{"grace", "heartbeat-interval", "check-timeout", "lock-timeout"} {
		if c.IsSet(f) && c.Duration(f) <= 0 {
			return usageErrorf("--%s %s: must be positive", f, c.Duration(f))
		}
	}
	conn, where, err := a.connectNoArgs(c, "verify")
	if err != nil {
		return err
	}
	ctx := c.Context
	defer conn.Close(ctx)
	vr, err := upgrade.Verify(ctx, conn)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return withCode(ExitEnvironment, fmt.Errorf("verifying %s: %w", where, err))
	}
	var found *versions.Detection
	if !vr.OK {
		// What the database is instead, and what to do: a half-done online
		// upgrade, an open quiesce, 0.16.0 not upgraded yet (best effort:
		// the checks above decide the exit code).
		if st, err := upgrade.Status(ctx, conn); err == nil {
			found = st.PgflowVersion
		}
	}
	var rr *routesResult
	if c.Bool("routes") {
		rr = &routesResult{}
		rr.Report, err = queueroutes.Read(ctx, conn, queueroutes.Options{
			HeartbeatInterval: c.Duration("heartbeat-interval"), Grace: c.Duration("grace"),
			StatementTimeout: c.Duration("check-timeout"), LockTimeout: c.Duration("lock-timeout"),
			ApplicationName: "pgflow-upgrade verify",
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.As(err, new(*session.LostError)) {
				return withCode(ExitEnvironment, fmt.Errorf("reading the routes of %s: %w", where, err))
			}
			rr.Error = err.Error()
		}
	}
	code := verifyExitCode(vr, rr)
	if jsonOutput(c) {
		out := struct {
			*upgrade.VerifyReport
			PgflowVersion *versions.Detection `json:"pgflow_version,omitempty"` // when a check failed
			Routes        *routesResult       `json:"routes,omitempty"`
		}{vr, found, rr}
		if err := writeCommandJSON(a.Stdout, "verify", where, code, out); err != nil {
			return err
		}
	} else if err := writeVerify(a.Stdout, where, vr, found, rr, code, c.Bool("verbose")); err != nil {
		return err
	}
	switch code {
	case ExitFindings:
		return reportedError{withCode(code, errors.New("verify failed"))}
	case ExitInconclusive:
		return reportedError{withCode(code, errors.New("verify cannot tell"))}
	}
	return nil
}

// verifyExitCode: a failed check or route 1; else a route that could not be
// read 4 (queueroutes.ErrNoRoutes is not unknown: the schema checks fail then);
// else 0.
func verifyExitCode(vr *upgrade.VerifyReport, rr *routesResult) int {
	switch {
	case !vr.OK:
		return ExitFindings
	case rr == nil:
		return ExitOK
	case rr.Report != nil && len(rr.Findings) > 0:
		return ExitFindings
	case rr.Error != "" || (rr.Report != nil && rr.Unknown > 0):
		return ExitInconclusive
	}
	return ExitOK
}

// writeVerify prints the verdict first, then what failed in full (with what
// to do), then one line per route that is fine; the table of every check and
// route only with verbose.
//
// found, when a schema check failed, is what the database is: its next step
// follows the verdict, so that a FAIL says what to do.
func writeVerify(w io.Writer, where string, vr *upgrade.VerifyReport, found *versions.Detection, rr *routesResult, code int, verbose bool) error {
	failed := upgrade.Failed(vr.Checks)
	verdict := map[int]string{ExitOK: "PASS", ExitFindings: "FAIL", ExitInconclusive: "CANNOT TELL"}[code]
	line := fmt.Sprintf("%s: %d of %d schema checks failed", verdict, len(failed), len(vr.Checks))
	if rr != nil {
		switch {
		case rr.Report == nil:
			line += "; routes: cannot tell"
		default:
			line += fmt.Sprintf("; %s, %d without a worker that can claim", plural(len(rr.Routes), "route", "routes"), len(rr.Findings))
			if rr.Unknown > 0 {
				line += fmt.Sprintf(", %d unreadable", rr.Unknown)
			}
		}
	}
	fmt.Fprintln(w, line)
	if found != nil {
		writeBlock(w, "pgflow version: ", versionSummary(found)+"; next step: "+withoutSelf(found.NextStep, "verify"), 2)
	}
	fmt.Fprintf(w, "verify of %s: exit %d\n", where, code)
	for _, o := range failed {
		writeBlock(w, "FAIL "+o.ID+": ", o.Title+": "+o.Detail, 2)
	}
	if rr != nil {
		writeRouteFindings(w, rr)
	}
	if verbose {
		fmt.Fprintln(w)
		var rows [][]string
		for _, o := range vr.Checks {
			res := "ok"
			if !o.OK {
				res = "FAIL"
			}
			rows = append(rows, []string{res, o.ID, o.Title, o.Detail})
		}
		if err := writeTable(w, []string{"result", "check", "condition", "detail"}, rows); err != nil {
			return err
		}
		if rr != nil && rr.Report != nil {
			if err := writeRoutesTable(w, rr.Report); err != nil {
				return err
			}
		}
	} else if len(failed) < len(vr.Checks) {
		fmt.Fprintf(w, "%s passed (--verbose lists them)\n", plural(len(vr.Checks)-len(failed), "schema check", "schema checks"))
	}
	return nil
}

// writeRouteFindings prints every failing or unreadable route in full, with
// what to deploy, then one line for the rest.
func writeRouteFindings(w io.Writer, rr *routesResult) {
	if rr.Report == nil {
		writeBlock(w, "CANNOT TELL routes: ", rr.Error+"; "+routesErrorRemedy(rr.Error), 2)
		return
	}
	for _, f := range rr.Findings {
		writeBlock(w, "FAIL route: ", f.Message, 2)
		writeBlock(w, "  remedy: ", f.Deploy, 4)
	}
	for _, r := range rr.Routes {
		if r.State == queueroutes.StateUnknown {
			writeBlock(w, "CANNOT TELL route: ", r.Where()+": "+r.Error, 2)
		}
	}
	if rr.LegacyBeside > 0 {
		writeBlock(w, "note: ", fmt.Sprintf("%s served by 0.17 workers still %s 0.16.0 workers registered beside them, which fail every claim they try: stop them",
			plural(rr.LegacyBeside, "route", "routes"), map[bool]string{true: "has", false: "have"}[rr.LegacyBeside == 1]), 2)
	}
}

// routesErrorRemedy says what to do when the routes could not be read.
func routesErrorRemedy(msg string) string {
	if msg == queueroutes.ErrNoRoutes.Error() {
		return "apply the upgrade first"
	}
	return "grant the role USAGE on schemas pgflow and pgmq and SELECT on their tables (docs/hardening.md), or give it more time with --check-timeout"
}
