// Command demo-worker runs a worker for a small demo flow on an upgraded
// pgflow database (the README's quick start).
//
//	demo-worker --dsn postgres://... --run '{"names":["Ada","Grace"]}'
//
// With --run it starts one run, prints its output when it completes and
// exits; without it, it keeps working (start runs with
// `select pgflow.start_flow('demo_greetings', '{"names":["Ada"]}')`) until
// SIGINT/SIGTERM, then stops gracefully. The connection string comes from
// --dsn, PGFLOW_UPGRADE_DSN, DATABASE_URL or libpq's PG* variables.
//
// --queue-mode flow (the default) runs flow demo_greetings with one worker
// that serves every step from the queue demo_greetings. --queue-mode step
// runs the same steps as flow demo_greetings_by_step, where each step has its
// own queue (demo_greetings_by_step__names, ...) and its own worker, as
// upstream's withStepQueues flows do. (A flow keeps the mode it was compiled
// with, so the two modes use two flows.)
//
// Exit codes: 0 done, 1 the run failed or the database is not upgraded,
// 2 usage error, 3 connection error, 130 interrupted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/dsn"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Flow is the demo flow: split the names, greet each (a map step), sum up.
// It is in flow mode: every step on the queue demo_greetings.
var Flow = worker.Flow{
	Slug:    "demo_greetings",
	Options: worker.FlowOptions{MaxAttempts: worker.Int(3), BaseDelay: worker.Int(1)},
	Steps: []worker.Step{
		{Slug: "names"},
		{Slug: "greet", Type: worker.StepMap, DependsOn: []string{"names"}},
		{Slug: "summary", DependsOn: []string{"greet"}},
	},
}

// StepFlow is the same flow in step mode: each step on its own queue.
var StepFlow = worker.Flow{
	Slug:      "demo_greetings_by_step",
	QueueMode: worker.QueueModeStep,
	Options:   Flow.Options,
	Steps:     Flow.Steps,
}

// Handlers are the demo flow's step handlers (for both modes).
var Handlers = map[string]worker.HandlerFunc{
	// Root single step: it reads the flow input (on its claim).
	"names": func(ctx context.Context, t *worker.Task) (any, error) {
		var in struct {
			Names []string `json:"names"`
		}
		if err := t.DecodeFlowInput(ctx, &in); err != nil {
			return nil, err
		}
		names := []string{}
		for _, n := range in.Names {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		return names, nil // an array: it feeds the map step
	},
	// Map step: one task per name, its input is that element.
	"greet": func(_ context.Context, t *worker.Task) (any, error) {
		var name string
		if err := t.DecodeInput(&name); err != nil {
			return nil, err
		}
		return fmt.Sprintf("Hello, %s!", name), nil
	},
	// Dependent single step: its input is {"greet": [...]}.
	"summary": func(_ context.Context, t *worker.Task) (any, error) {
		var in struct {
			Greet []string `json:"greet"`
		}
		if err := t.DecodeInput(&in); err != nil {
			return nil, err
		}
		return map[string]any{"count": len(in.Greet), "text": strings.Join(in.Greet, " ")}, nil
	},
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsnFlag := fs.String("dsn", "", "connection string (else PGFLOW_UPGRADE_DSN, DATABASE_URL, PG* variables)")
	runInput := fs.String("run", "", `start one run with this JSON input (e.g. {"names":["Ada"]}), print its output and exit`)
	concurrency := fs.Int("concurrency", 4, "handlers running at once (per worker)")
	queueMode := fs.String("queue-mode", "flow", "flow: one worker, every step on one queue; step: a queue and a worker per step")
	verbose := fs.Bool("v", false, "log every task")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	flow := Flow
	switch *queueMode {
	case "flow":
	case "step":
		flow = StepFlow
	default:
		fmt.Fprintf(stderr, "demo-worker: --queue-mode is flow or step, not %q\n", *queueMode)
		return 2
	}
	if *runInput != "" && !json.Valid([]byte(*runInput)) {
		fmt.Fprintln(stderr, "demo-worker: --run is not valid JSON")
		return 2
	}
	resolved := dsn.Resolve(*dsnFlag, getenv)
	if resolved.Source == dsn.SourceNone {
		fmt.Fprintln(stderr, "demo-worker: no database: pass --dsn or set PGFLOW_UPGRADE_DSN / DATABASE_URL")
		return 2
	}
	if _, err := dsn.ParseConfig(resolved.DSN); err != nil {
		fmt.Fprintf(stderr, "demo-worker: %v\n", err)
		return 2
	}
	redact := func(err error) string { return dsn.RedactText(err.Error(), resolved.DSN) }

	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	pool, err := pgxpool.New(ctx, resolved.DSN)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo-worker: connecting (%s): %s\n", resolved.Source, redact(err))
		return 3
	}
	defer pool.Close()

	done := make(chan struct{}, 1)
	var ws []*worker.Worker
	// Flow mode: one worker for every step. Step mode: one per step, each on
	// its step's queue.
	stepSlugs := []string{""}
	if flow.QueueMode == worker.QueueModeStep {
		stepSlugs = stepSlugs[:0]
		for _, s := range flow.Steps {
			stepSlugs = append(stepSlugs, s.Slug)
		}
	}
	for _, step := range stepSlugs {
		w, err := worker.New(pool, worker.Config{
			Flow: flow, StepSlug: step, Handlers: Handlers, Concurrency: *concurrency, Logger: logger,
			FunctionName: "demo-worker",
			OnResult: func(worker.Result) {
				select {
				case done <- struct{}{}:
				default:
				}
			},
		})
		if err != nil {
			fmt.Fprintf(stderr, "demo-worker: %v\n", err)
			return 2
		}
		ws = append(ws, w)
	}
	stopWorkers := func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, w := range ws {
			if err := w.Stop(stopCtx); err != nil {
				fmt.Fprintf(stderr, "demo-worker: %s\n", redact(err))
			}
		}
	}
	if *runInput == "" {
		fmt.Fprintf(stdout, "demo-worker: working on flow %s (%s mode); Ctrl-C stops gracefully\n", flow.Slug, *queueMode)
		if len(ws) == 1 {
			if err := ws[0].Run(ctx); err != nil {
				return report(stderr, err, redact)
			}
			return 0
		}
		for _, w := range ws {
			if err := w.Start(context.WithoutCancel(ctx)); err != nil {
				stopWorkers()
				return report(stderr, err, redact)
			}
		}
		<-ctx.Done()
		stopWorkers()
		return 0
	}

	for _, w := range ws {
		if err := w.Start(context.WithoutCancel(ctx)); err != nil {
			stopWorkers()
			return report(stderr, err, redact)
		}
	}
	defer stopWorkers()

	var runID string
	if err := pool.QueryRow(ctx, `select run_id::text from pgflow.start_flow($1, $2::jsonb)`, flow.Slug, *runInput).Scan(&runID); err != nil {
		fmt.Fprintf(stderr, "demo-worker: starting a run: %s\n", redact(err))
		return 1
	}
	fmt.Fprintf(stderr, "demo-worker: run %s started\n", runID)
	stopped := anyDone(ws)
	for {
		var status string
		var output json.RawMessage
		if err := pool.QueryRow(ctx, `select status, output from pgflow.runs where run_id = $1::uuid`, runID).Scan(&status, &output); err != nil {
			if ctx.Err() != nil {
				return 130
			}
			fmt.Fprintf(stderr, "demo-worker: reading run %s: %s\n", runID, redact(err))
			return 1
		}
		switch status {
		case "completed":
			fmt.Fprintln(stdout, string(output))
			return 0
		case "failed":
			fmt.Fprintf(stderr, "demo-worker: run %s failed\n", runID)
			return 1
		}
		// Look again after the next task outcome (or every second, in case
		// another worker is doing the work).
		select {
		case <-done:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return 130
		case <-stopped:
			fmt.Fprintln(stderr, "demo-worker: a worker stopped (deprecated?)")
			return 1
		}
	}
}

func report(stderr io.Writer, err error, redact func(error) string) int {
	if errors.Is(err, worker.ErrProtocolMismatch) {
		fmt.Fprintf(stderr, "demo-worker: %s\n", redact(err))
		fmt.Fprintln(stderr, "demo-worker: this database does not speak pgflow 0.17's worker protocol; upgrade it with `pgflow-upgrade apply`")
		return 1
	}
	fmt.Fprintf(stderr, "demo-worker: %s\n", redact(err))
	return 1
}

// anyDone is closed when any of the workers has stopped (its goroutines end
// when every worker has).
func anyDone(ws []*worker.Worker) <-chan struct{} {
	out := make(chan struct{})
	var once sync.Once
	for _, w := range ws {
		go func() {
			<-w.Done()
			once.Do(func() { close(out) })
		}()
	}
	return out
}
