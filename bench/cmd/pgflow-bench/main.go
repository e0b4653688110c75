// Command pgflow-bench runs the benchmarks of BENCHMARKS.md:
//
//	go run ./bench/cmd/pgflow-bench [-sizes 1000000,5000000] [-repeat 3] [NAME...]
//
// It uses PGFLOW_UPGRADE_BENCH_DSN when set, otherwise an ephemeral local
// cluster, and prints a Markdown table.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/bench"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
)

func main() {
	sizes := flag.String("sizes", "1000000,5000000", "step_tasks rows of the generated databases, comma separated")
	repeat := flag.Int("repeat", 3, "measurements per case (median reported)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	srv, err := pgprovider.Open(ctx, pgprovider.Options{DSN: os.Getenv("PGFLOW_UPGRADE_BENCH_DSN"), SkipDocker: true, Logf: logf,
		Settings: map[string]string{"shared_buffers": "1GB", "maintenance_work_mem": "512MB", "work_mem": "64MB"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgflow-bench:", err)
		os.Exit(3)
	}
	env := &bench.Env{Server: srv, Repeat: *repeat, Logf: logf}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgflow-bench: -sizes %q: %v\n", *sizes, err)
			os.Exit(2)
		}
		env.Sizes = append(env.Sizes, n)
	}
	err = bench.Run(ctx, env, flag.Args(), os.Stdout)
	env.Close()
	srv.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgflow-bench:", err)
		os.Exit(1)
	}
}
