// Command pgflow-bench runs the benchmarks of BENCHMARKS.md:
//
//	go run ./bench/cmd/pgflow-bench [-sizes 1000000,5000000] [-repeat 3] [-cpuprofile FILE] [NAME...]
//
// -cpuprofile writes a Go CPU profile of this process (the benchmark's Go
// side: the workers of "worker", the tool in the others) for go tool pprof.
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
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/bench"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
)

func main() { os.Exit(run()) }

// run is main with an exit code, so that deferred work (the CPU profile)
// ends before the process does.
func run() int {
	sizes := flag.String("sizes", "1000000,5000000", "step_tasks rows of the generated databases, comma separated")
	repeat := flag.Int("repeat", 3, "measurements per case (median reported)")
	cpuProfile := flag.String("cpuprofile", "", "write a Go CPU profile of this process to `FILE`")
	flag.Parse()
	// Bad arguments are refused before anything is started.
	var sizeList []int64
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pgflow-bench: -sizes %q: %v\n", *sizes, err)
			return 2
		}
		sizeList = append(sizeList, n)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgflow-bench: -cpuprofile:", err)
			return 2
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "pgflow-bench: -cpuprofile:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	srv, err := pgprovider.Open(ctx, pgprovider.Options{DSN: os.Getenv("PGFLOW_UPGRADE_BENCH_DSN"), SkipDocker: true, Logf: logf,
		Settings: map[string]string{"shared_buffers": "1GB", "maintenance_work_mem": "512MB", "work_mem": "64MB"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgflow-bench:", err)
		return 3
	}
	env := &bench.Env{Server: srv, Repeat: *repeat, Logf: logf, Sizes: sizeList}
	err = bench.Run(ctx, env, flag.Args(), os.Stdout)
	env.Close()
	srv.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgflow-bench:", err)
		return 1
	}
	return 0
}
