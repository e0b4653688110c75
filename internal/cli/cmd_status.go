package cli

import (
	"errors"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func (a *App) statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "schema state (baseline, upgraded, partial, unknown, not_pgflow), applied revisions, pending migrations, atlas.sum validity",
		Description: "Read-only: catalog queries and pgflow_upgrade.schema_revisions, in a READ ONLY transaction with\n" +
			"statement_timeout and lock_timeout set.\n" +
			"Exit codes: 0 baseline, upgraded or not pgflow; 1 partial/unknown schema or embedded migrations\n" +
			"not matching atlas.sum; 3 connection error.",
		Action: a.statusAction,
		OnUsageError: func(c *ucli.Context, err error, _ bool) error {
			return usageErrorf("status: %v (see status --help)", err)
		},
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
		fmt.Fprintf(w, "pgflow-upgrade status of %s\nschema state: %s\n", where, st.State.State)
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
			applied := "pending"
			for _, r := range st.Applied {
				if r.Version == m.Version {
					applied = "applied " + r.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
				}
			}
			rows = append(rows, []string{m.Version, m.Name, applied})
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
