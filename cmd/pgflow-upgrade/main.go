// Command pgflow-upgrade takes pgflow 0.16.0 databases to pgflow 0.17.0,
// safely. All logic lives in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app := &cli.App{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Interactive: cli.IsTerminal(os.Stdin) && cli.IsTerminal(os.Stdout)}
	code := app.Run(ctx, os.Args)
	stop()
	os.Exit(code)
}
