package cli

import (
	"fmt"
	"runtime"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func (a *App) versionCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "version",
		Usage: "print the tool version and the hash of the embedded migrations",
		Action: func(c *ucli.Context) error {
			info := map[string]string{
				"version":         Version,
				"migrations_hash": migrations.Hash(),
				"go":              runtime.Version(),
			}
			if jsonOutput(c) {
				return writeJSON(a.Stdout, info)
			}
			fmt.Fprintf(a.Stdout, "pgflow-upgrade %s\nmigrations atlas.sum %s\n%s\n", info["version"], info["migrations_hash"], info["go"])
			return nil
		},
	}
}
