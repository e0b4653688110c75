package cli

import (
	"errors"
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func (a *App) verifyCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "verify",
		Usage: "after apply: schema pgflow is upstream's 0.17.0 and the 0.16.0 claim is gone",
		Description: "Read-only catalog checks in a READ ONLY transaction: every table, column, constraint,\n" +
			"index, type and function (with its attributes) of pgflow 0.17.0's catalog present and\n" +
			"defined the same (0.17.1+'s when upstream's later migrations are applied; objects of your own\n" +
			"tolerated and named), the 0.16.0 " + versions.StartTasks016.String() + ",\n" +
			versions.EnsureFlowCompiled016.String() + " and pgflow._create_flow_from_shape(text, jsonb)\n" +
			"gone, no trigger on step_tasks.\n" +
			"Exit codes: 0 all pass, 1 any check failed, 3 connection error.",
		Action: a.verifyAction,
	}
}

func (a *App) verifyAction(c *ucli.Context) error {
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
	failed := upgrade.Failed(vr.Checks)
	code := ExitOK
	if !vr.OK {
		code = ExitFindings
	}
	if jsonOutput(c) {
		out := struct {
			Command  string `json:"command"`
			Database string `json:"database"`
			ExitCode int    `json:"exit_code"`
			*upgrade.VerifyReport
		}{"verify", where, code, vr}
		if err := writeJSON(a.Stdout, out); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.Stdout, "pgflow-upgrade verify of %s\n", where)
		var rows [][]string
		for _, o := range vr.Checks {
			res := "ok"
			if !o.OK {
				res = "FAIL"
			}
			rows = append(rows, []string{res, o.ID, o.Title, o.Detail})
		}
		if err := writeTable(a.Stdout, []string{"result", "check", "condition", "detail"}, rows); err != nil {
			return err
		}
		fmt.Fprintf(a.Stdout, "%d of %d checks failed\n", len(failed), len(vr.Checks))
	}
	if code != ExitOK {
		return reportedError{withCode(code, errors.New("verify failed"))}
	}
	return nil
}
