package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// runExitCode is the exit code of a run that changes the database (apply,
// apply --online, --rollback-online, --undo-quiesce) from what it returned:
// 0 when it succeeded (a nil error, whatever success its outcome names),
// 130 when it was interrupted, 3 when its session was lost or the
// environment stopped it (an envError: a rerun meets it again), 4 when a
// preflight check had no answer, 1 for every other refusal or failure.
func runExitCode(ctx context.Context, o outcome.Outcome, err error) int {
	var lost *session.LostError
	var env *envError
	switch {
	case err == nil:
		return ExitOK
	case ctx.Err() != nil || o == outcome.Interrupted:
		return ExitInterrupted
	case errors.As(err, &lost), errors.As(err, &env):
		return ExitEnvironment
	case o == outcome.Inconclusive:
		return ExitInconclusive
	}
	return ExitFindings
}

// finishRun is the one output path of the runs: it prints res as JSON
// (command, database, exit_code, then the result) or, with table, as the
// command's table, and returns what the command returns: nil for exit 0,
// otherwise err with its exit code, already reported (the message also on
// stderr, unless the run was interrupted).
func finishRun[R any](a *App, c *ucli.Context, command, where string, res *outcome.Result[R], err error, table func(io.Writer) error) error {
	var env *envError
	if err != nil && c.Context.Err() == nil && !errors.As(err, &env) {
		// A run its command did not diagnose (--rollback-online,
		// --undo-quiesce): a lost server, a full disk, said as everywhere
		// (failure.go).
		if e := explainFailure(err, command); e != nil {
			res.Message = e.Error() + "; what its transactions committed stays, the one that was open was rolled back (`pgflow-upgrade status` shows where it stands)"
			err = e
		}
	}
	code := runExitCode(c.Context, res.Outcome, err)
	if jsonOutput(c) {
		if werr := writeCommandJSON(a.Stdout, command, where, code, res); werr != nil {
			return werr
		}
	} else if werr := table(a.Stdout); werr != nil {
		return werr
	}
	switch code {
	case ExitOK:
		return nil
	case ExitInterrupted:
		return reportedError{withCode(code, fmt.Errorf("interrupted: %w", err))}
	}
	fmt.Fprintf(a.Stderr, "pgflow-upgrade %s: %s\n", command, a.redact(res.Message))
	return reportedError{withCode(code, err)}
}

// writeCommandJSON prints the JSON document of a command: command,
// database and exit_code, then body's members, indented as writeJSON does.
func writeCommandJSON(w io.Writer, command, where string, code int, body any) error {
	head, err := json.Marshal(struct {
		Command  string `json:"command"`
		Database string `json:"database"`
		ExitCode int    `json:"exit_code"`
	}{command, where, code})
	if err != nil {
		return err
	}
	rest, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("writing the %s report as JSON: %w", command, err)
	}
	doc, err := outcome.MergeObjects(head, rest)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, doc, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}
