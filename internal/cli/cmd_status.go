package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func (a *App) statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "the pgflow version found (older than 0.16.0, 0.16.0, 0.17.x, an online upgrade in progress, unknown: what differs) with the next step, applied revisions, pending migrations, atlas.sum validity",
		Description: "Read-only: catalog queries and pgflow_upgrade.schema_revisions, in a READ ONLY transaction with\n" +
			"statement_timeout and lock_timeout set.\n" +
			"Exit codes: 0 pgflow 0.16.0, 0.17.x or not pgflow; 1 older than 0.16.0, partial/unknown schema or embedded migrations\n" +
			"not matching atlas.sum; 3 connection error.",
		Action: a.statusAction,
	}
}

func (a *App) statusAction(c *ucli.Context) error {
	conn, where, err := a.connectNoArgs(c, "status")
	if err != nil {
		return err
	}
	ctx := c.Context
	defer conn.Close(ctx)
	st, err := upgrade.Status(ctx, conn)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	on, err := onlineStatus(ctx, conn) // cmd_apply_online.go
	if err != nil {
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	if !on.Annotate(st.PgflowVersion) { // an online upgrade in progress: its phase and how to continue
		on = nil // e.g. a 0.17.x database: its queue_name column is no backfill of ours
	}
	qs, err := quiesceStatus(ctx, conn) // cmd_apply_quiesce.go
	if err != nil {
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	code := ExitOK
	if (st.NeedsAttention() && on == nil) || qs != nil {
		code = ExitFindings // an online upgrade in progress is a known partial state; a recorded quiesce has functions disabled
	}
	if jsonOutput(c) {
		out := struct {
			Command  string `json:"command"`
			Database string `json:"database"`
			ExitCode int    `json:"exit_code"`
			*upgrade.StatusReport
			Online  *online.StatusInfo  `json:"online,omitempty"`
			Quiesce *quiesce.StatusInfo `json:"quiesce,omitempty"`
		}{"status", where, code, st, on, qs}
		if err := writeJSON(a.Stdout, out); err != nil {
			return err
		}
	} else {
		w := a.Stdout
		fmt.Fprintf(w, "pgflow-upgrade status of %s\n", where)
		writeVersion(w, st.PgflowVersion)
		fmt.Fprintf(w, "schema state: %s\n", st.State.State)
		for _, d := range st.State.Differences {
			fmt.Fprintf(w, "  %s\n", d)
		}
		writeOnlineStatus(w, on)
		writeQuiesceStatus(w, qs)
		sum := "valid"
		if !st.AtlasSum.Valid {
			sum = "INVALID: " + st.AtlasSum.Error
		}
		fmt.Fprintf(w, "embedded migrations: atlas.sum %s (%s)\n", sum, migrations.Hash())
		var rows [][]string
		for _, m := range st.Migrations {
			rows = append(rows, []string{m.Version, m.Name, m.Status})
		}
		// Revisions the database has that this binary does not embed.
		for _, r := range st.Applied {
			known := false
			for _, m := range st.Migrations {
				known = known || m.Version == r.Version
			}
			if !known {
				rows = append(rows, []string{r.Version, r.Name, "applied (not embedded in this binary)"})
			}
		}
		if err := writeTable(w, []string{"version", "name", "status"}, rows); err != nil {
			return err
		}
		if len(st.Pending) > 0 {
			fmt.Fprintf(w, "pending: %s\n", strings.Join(st.Pending, ", "))
		} else {
			fmt.Fprintln(w, "pending: none")
		}
	}
	if code != ExitOK {
		return reportedError{withCode(code, errors.New("status needs attention"))}
	}
	return nil
}

// writeVersion prints the pgflow version found and the next step (status,
// audit and apply print the same two lines).
func writeVersion(w io.Writer, d *versions.Detection) {
	if d == nil {
		return
	}
	fmt.Fprintf(w, "pgflow version: %s\nnext step: %s\n", d.Summary(), d.NextStep)
}
