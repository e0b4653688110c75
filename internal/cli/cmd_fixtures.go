package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

func (a *App) fixturesCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "fixtures",
		Usage: "named pgflow 0.16.0 database states",
		Subcommands: []*ucli.Command{
			{
				Name:  "list",
				Usage: "list the named states",
				Action: func(c *ucli.Context) error {
					var rows [][]string
					type item struct {
						Name        string `json:"name"`
						Description string `json:"description"`
					}
					var items []item
					for _, s := range fixtures.States() {
						rows = append(rows, []string{s.Name, s.Description})
						items = append(items, item{s.Name, s.Description})
					}
					if jsonOutput(c) {
						return writeJSON(a.Stdout, map[string]any{"states": items})
					}
					return writeTable(a.Stdout, []string{"state", "what it holds"}, rows)
				},
			},
			{
				Name:      "load",
				Usage:     "load a named state into the empty database given by --dsn (without a DSN: into an ephemeral local cluster, then report and remove it)",
				ArgsUsage: "NAME",
				Action:    a.fixturesLoad,
			},
			a.fixturesReplayCommand(),
			a.fixturesCaptureCommand(),
		},
	}
}

func (a *App) fixturesLoad(c *ucli.Context) error {
	if c.NArg() != 1 {
		return usageErrorf("fixtures load takes exactly one state name (see `fixtures list`)")
	}
	state, err := fixtures.Lookup(c.Args().First())
	if err != nil {
		return withCode(ExitUsage, err)
	}
	t, err := a.resolveTarget(c, "fixtures load", true)
	if err != nil {
		return err
	}
	ctx := c.Context
	where := ""
	if t.resolved.Source == session.SourceNone {
		// The embedded default: an ephemeral cluster that lives for this command.
		srv, err := pgprovider.Open(ctx, pgprovider.Options{SkipDocker: true,
			Logf: func(f string, args ...any) { fmt.Fprintf(a.Stderr, f+"\n", args...) }})
		if err != nil {
			return withCode(ExitEnvironment, err)
		}
		defer srv.Close()
		fmt.Fprintf(a.Stderr, "no DSN given: using %s, removed when this command ends\n", srv.Describe())
		if t.config, err = session.Config(srv.DSNFor("postgres"), session.Options{Purpose: session.Tool, Name: "fixtures load"}); err != nil {
			return withCode(ExitEnvironment, err)
		}
		where = "ephemeral " + srv.Describe()
	} else {
		where = session.Describe(t.config)
	}
	conn, err := a.connect(ctx, t)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := writePrecheck(ctx, conn, "fixtures load"); err != nil { // envcheck.go: a standby, a read-only default
		return withCode(ExitEnvironment, fmt.Errorf("fixtures load %s into %s: %w", state.Name, where, err))
	}
	summary, err := loadState(ctx, conn, state)
	if err != nil {
		if errors.Is(err, fixtures.ErrNotEmpty) {
			return withCode(ExitFindings, fmt.Errorf("fixtures load %s into %s: %w", state.Name, where, err))
		}
		return withCode(ExitEnvironment, fmt.Errorf("fixtures load %s into %s: %w", state.Name, where, err))
	}
	if jsonOutput(c) {
		return writeJSON(a.Stdout, map[string]any{"state": state.Name, "database": where, "rows": summary})
	}
	fmt.Fprintf(a.Stdout, "loaded %s into %s\n", state.Name, where)
	var rows [][]string
	for _, r := range summary {
		rows = append(rows, []string{r.Table, fmt.Sprint(r.Rows)})
	}
	return writeTable(a.Stdout, []string{"table", "rows"}, rows)
}

type tableCount struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows"`
}

// loadState loads state in one transaction, so a failure leaves nothing, and
// counts what it made.
func loadState(ctx context.Context, conn *pgx.Conn, state fixtures.State) ([]tableCount, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := state.Load(ctx, tx); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	var out []tableCount
	for _, table := range []string{"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"} {
		var n int64
		q := "select pg_catalog.count(*) from " + pgx.Identifier{"pgflow", table}.Sanitize()
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			return nil, fmt.Errorf("counting pgflow.%s: %w", table, err)
		}
		out = append(out, tableCount{table, n})
	}
	return out, nil
}
