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

// A service that runs one flow until SIGINT/SIGTERM, then stops gracefully.
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
				if err := t.DecodeInput(&in); err != nil {
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
		log.Fatal("the database is not upgraded: run `pgflow-upgrade apply` first: ", err)
	} else if err != nil {
		log.Fatal(err)
	}
}
