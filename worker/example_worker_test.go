package worker_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// A service that runs a flow-mode flow (every step on the queue "greet")
// until SIGINT/SIGTERM, then stops gracefully.
func ExampleWorker_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	w, err := worker.New(pool, worker.Config{
		Flow: worker.Flow{Slug: "greet", Steps: []worker.Step{
			{Slug: "shout"},
		}},
		Handlers: map[string]worker.HandlerFunc{
			"shout": func(ctx context.Context, t *worker.Task) (any, error) {
				var in struct{ Name string }
				if err := t.DecodeFlowInput(ctx, &in); err != nil {
					return nil, err // fail_task: retried with the engine's delays
				}
				return strings.ToUpper(in.Name), nil // complete_task
			},
		},
		Concurrency: 4,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); errors.Is(err, worker.ErrProtocolMismatch) {
		log.Fatal("the database is still pgflow 0.16.0: run `pgflow-upgrade apply` first: ", err)
	} else if errors.Is(err, worker.ErrFlowMismatch) {
		log.Fatal("the flow in the database differs from this definition: ", err)
	} else if err != nil {
		log.Fatal(err)
	}
}

// A step-mode flow: each step has its own queue, and each worker serves one
// step. Here one process runs a worker per step; they could as well be
// separate services, scaled apart.
func ExampleWorker_Run_stepMode() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	flow := worker.Flow{Slug: "thumbnails", QueueMode: worker.QueueModeStep, Steps: []worker.Step{
		{Slug: "list"},
		{Slug: "resize", Type: worker.StepMap, DependsOn: []string{"list"}},
	}}
	handlers := map[string]worker.HandlerFunc{
		"list": func(ctx context.Context, t *worker.Task) (any, error) {
			return []string{"a.png", "b.png"}, nil
		},
		"resize": func(ctx context.Context, t *worker.Task) (any, error) {
			var name string
			if err := t.DecodeInput(&name); err != nil {
				return nil, err
			}
			return "small/" + name, nil
		},
	}
	errs := make(chan error, len(flow.Steps))
	for _, step := range flow.Steps {
		w, err := worker.New(pool, worker.Config{Flow: flow, StepSlug: step.Slug, Handlers: handlers})
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("step %s polls queue %s", step.Slug, w.Queue()) // thumbnails__list, thumbnails__resize
		go func() { errs <- w.Run(ctx) }()
	}
	for range flow.Steps {
		if err := <-errs; err != nil {
			log.Print(err)
		}
	}
}
