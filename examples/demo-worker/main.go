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

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
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

// options are demo-worker's command-line flags.
type options struct {
	dsn         string
	runInput    string // --run: the JSON input of the one run to start; "" to keep working
	concurrency int
	queueMode   string
	verbose     bool
	flow        worker.Flow // Flow or StepFlow, as --queue-mode says
}

// parseOptions reads the flags; false when they are unusable (exit 2), the
// reason already written to stderr.
func parseOptions(args []string, stderr io.Writer) (options, bool) {
	fs := flag.NewFlagSet("demo-worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsnFlag := fs.String("dsn", "", "connection string (else PGFLOW_UPGRADE_DSN, DATABASE_URL, PG* variables)")
	runInput := fs.String("run", "", `start one run with this JSON input (e.g. {"names":["Ada"]}), print its output and exit`)
	concurrency := fs.Int("concurrency", 4, "handlers running at once (per worker)")
	queueMode := fs.String("queue-mode", "flow", "flow: one worker, every step on one queue; step: a queue and a worker per step")
	verbose := fs.Bool("v", false, "log every task")
	if err := fs.Parse(args); err != nil {
		return options{}, false
	}
	o := options{dsn: *dsnFlag, runInput: *runInput, concurrency: *concurrency, queueMode: *queueMode, verbose: *verbose, flow: Flow}
	switch o.queueMode {
	case "flow":
	case "step":
		o.flow = StepFlow
	default:
		fmt.Fprintf(stderr, "demo-worker: --queue-mode is flow or step, not %q\n", o.queueMode)
		return options{}, false
	}
	if o.runInput != "" && !json.Valid([]byte(o.runInput)) {
		fmt.Fprintln(stderr, "demo-worker: --run is not valid JSON")
		return options{}, false
	}
	return o, true
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	opts, ok := parseOptions(args, stderr)
	if !ok {
		return 2
	}
	resolved := session.Resolve(opts.dsn, getenv)
	if resolved.Source == session.SourceNone {
		fmt.Fprintln(stderr, "demo-worker: no database: pass --dsn or set PGFLOW_UPGRADE_DSN / DATABASE_URL")
		return 2
	}
	if _, err := session.ParseConfig(resolved.DSN); err != nil {
		fmt.Fprintf(stderr, "demo-worker: %v\n", err)
		return 2
	}
	d := &demo{
		opts: opts, stdout: stdout, stderr: stderr,
		redact: func(err error) string { return session.RedactText(err.Error(), resolved.DSN) },
		done:   make(chan struct{}, 1),
	}

	level := slog.LevelWarn
	if opts.verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	pool, err := pgxpool.New(ctx, resolved.DSN)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo-worker: connecting (%s): %s\n", resolved.Source, d.redact(err))
		return 3
	}
	defer pool.Close()
	d.pool = pool

	if err := d.newWorkers(logger); err != nil {
		fmt.Fprintf(stderr, "demo-worker: %v\n", err)
		return 2
	}
	if opts.runInput == "" {
		return d.workUntilInterrupted(ctx)
	}
	return d.runOnce(ctx)
}

// demo is one demo-worker process: its pool, its workers and its output.
type demo struct {
	opts           options
	stdout, stderr io.Writer
	redact         func(error) string // an error's text without the connection string's secrets
	pool           *pgxpool.Pool
	ws             []*worker.Worker
	done           chan struct{} // receives (without blocking) after any task outcome
}

// newWorkers configures the workers. Flow mode: one worker for every step.
// Step mode: one per step, each on its step's queue.
func (d *demo) newWorkers(logger *slog.Logger) error {
	flow := d.opts.flow
	stepSlugs := []string{""}
	if flow.QueueMode == worker.QueueModeStep {
		stepSlugs = stepSlugs[:0]
		for _, s := range flow.Steps {
			stepSlugs = append(stepSlugs, s.Slug)
		}
	}
	for _, step := range stepSlugs {
		w, err := worker.New(d.pool, worker.Config{
			Flow: flow, StepSlug: step, Handlers: Handlers, Concurrency: d.opts.concurrency, Logger: logger,
			FunctionName: "demo-worker",
			OnResult: func(worker.Result) {
				select {
				case d.done <- struct{}{}:
				default:
				}
			},
		})
		if err != nil {
			return err
		}
		d.ws = append(d.ws, w)
	}
	return nil
}

// startWorkers starts every worker, stopping those started if one fails.
// They run until stopWorkers, not until ctx ends: a stop is graceful.
func (d *demo) startWorkers(ctx context.Context) error {
	for _, w := range d.ws {
		if err := w.Start(context.WithoutCancel(ctx)); err != nil {
			d.stopWorkers()
			return err
		}
	}
	return nil
}

func (d *demo) stopWorkers() {
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, w := range d.ws {
		if err := w.Stop(stopCtx); err != nil {
			fmt.Fprintf(d.stderr, "demo-worker: %s\n", d.redact(err))
		}
	}
}

// workUntilInterrupted works on the flow until ctx ends (SIGINT/SIGTERM).
func (d *demo) workUntilInterrupted(ctx context.Context) int {
	fmt.Fprintf(d.stdout, "demo-worker: working on flow %s (%s mode); Ctrl-C stops gracefully\n", d.opts.flow.Slug, d.opts.queueMode)
	if len(d.ws) == 1 {
		if err := d.ws[0].Run(ctx); err != nil {
			return report(d.stderr, err, d.redact)
		}
		return 0
	}
	if err := d.startWorkers(ctx); err != nil {
		return report(d.stderr, err, d.redact)
	}
	<-ctx.Done()
	d.stopWorkers()
	return 0
}

// runOnce starts one run with --run's input, waits for it to end and
// prints its output.
func (d *demo) runOnce(ctx context.Context) int {
	if err := d.startWorkers(ctx); err != nil {
		return report(d.stderr, err, d.redact)
	}
	defer d.stopWorkers()

	var runID string
	if err := d.pool.QueryRow(ctx, `select run_id::text from pgflow.start_flow($1, $2::jsonb)`, d.opts.flow.Slug, d.opts.runInput).Scan(&runID); err != nil {
		fmt.Fprintf(d.stderr, "demo-worker: starting a run: %s\n", d.redact(err))
		return 1
	}
	fmt.Fprintf(d.stderr, "demo-worker: run %s started\n", runID)
	return d.waitForRun(ctx, runID)
}

// waitForRun polls the run until it completes (its output on stdout, 0) or
// fails (1), a worker stops (1) or ctx ends (130).
func (d *demo) waitForRun(ctx context.Context, runID string) int {
	stopped := anyDone(d.ws)
	for {
		var status string
		var output json.RawMessage
		if err := d.pool.QueryRow(ctx, `select status, output from pgflow.runs where run_id = $1::uuid`, runID).Scan(&status, &output); err != nil {
			if ctx.Err() != nil {
				return 130
			}
			fmt.Fprintf(d.stderr, "demo-worker: reading run %s: %s\n", runID, d.redact(err))
			return 1
		}
		switch status {
		case "completed":
			fmt.Fprintln(d.stdout, string(output))
			return 0
		case "failed":
			fmt.Fprintf(d.stderr, "demo-worker: run %s failed\n", runID)
			return 1
		}
		// Look again after the next task outcome (or every second, in case
		// another worker is doing the work).
		select {
		case <-d.done:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return 130
		case <-stopped:
			fmt.Fprintln(d.stderr, "demo-worker: a worker stopped (deprecated?)")
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
