package scenario

// The scenario about step-mode routes: a step whose worker was never
// deployed is found by the route check (verify --routes), and passes once
// that worker runs.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/routes"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// stepFlow is a step-mode flow: fetch → resize, each step on its own queue
// (stepflow__fetch, stepflow__resize).
var stepFlow = worker.Flow{Slug: "stepflow", QueueMode: worker.QueueModeStep, Steps: []worker.Step{
	{Slug: "fetch"}, {Slug: "resize", DependsOn: []string{"fetch"}},
}}

// routeGrace is the scenario's --grace: short, so the check can see a
// message waiting without the scenario sleeping for the default's 20 s.
const routeGrace = 300 * time.Millisecond

// startStepWorker starts a package worker serving one step of stepFlow.
func startStepWorker(ctx context.Context, db *DB, step string) (*worker.Worker, error) {
	ok := func(context.Context, *worker.Task) (any, error) { return map[string]string{"step": step}, nil }
	w, err := worker.New(db.Pool, worker.Config{Flow: stepFlow, StepSlug: step, FunctionName: "stepflow-" + step,
		Handlers: map[string]worker.HandlerFunc{"fetch": ok, "resize": ok}, MaxPollSeconds: 1, Logger: quiet})
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, fmt.Errorf("the %s worker: %w", step, err)
	}
	return w, nil
}

// readRoutes runs the route check verify --routes runs, on its own session.
func readRoutes(ctx context.Context, db *DB) (*routes.Report, error) {
	conn, err := session.Open(ctx, db.DSN, session.Rehearsal) // as the CLI's verify --routes
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return routes.Read(ctx, conn, routes.Options{Grace: routeGrace})
}

func stepRouteWithoutWorker(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	// Only fetch's worker is deployed: its startup compiles the flow and
	// creates both step queues.
	fetch, err := startStepWorker(ctx, db, "fetch")
	if err != nil {
		return err
	}
	defer fetch.Stop(context.WithoutCancel(ctx))
	if _, err := db.Pool.Exec(ctx, `select count(*) from pgflow.start_flow($1, '{}'::jsonb)`, stepFlow.Slug); err != nil {
		return fmt.Errorf("start_flow: %w", err)
	}
	// fetch completes; resize's message goes to its own queue and waits.
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		n, err := CountRows(ctx, db, `select count(*) from pgmq.q_stepflow__resize`)
		return n == 1, err
	}); err != nil {
		return fmt.Errorf("waiting for resize's message: %w", err)
	}
	time.Sleep(routeGrace + 100*time.Millisecond)
	rep, err := readRoutes(ctx, db)
	if err != nil {
		return fmt.Errorf("the route check: %w", err)
	}
	if len(rep.Findings) != 1 {
		return errorf("the route check found %d failing routes, want 1 (resize): %+v", len(rep.Findings), rep.Findings)
	}
	f := rep.Findings[0]
	if f.Flow != stepFlow.Slug || f.Step != "resize" || f.Queue != "stepflow__resize" || f.State != routes.StateNoWorker || f.Waiting != 1 ||
		!strings.Contains(f.Deploy, "step resize of flow stepflow") {
		return errorf("the route check's finding: %+v", f)
	}
	env.Notef("without resize's worker: %s; remedy: %s", f.Message, f.Deploy)

	resize, err := startStepWorker(ctx, db, "resize")
	if err != nil {
		return err
	}
	defer resize.Stop(context.WithoutCancel(ctx))
	if err := waitFor(ctx, 30*time.Second, func() (bool, error) {
		n, err := CountRows(ctx, db, `select count(*) from pgflow.runs where flow_slug = $1 and status = 'completed'`, stepFlow.Slug)
		return n == 1, err
	}); err != nil {
		return fmt.Errorf("waiting for the run to complete once resize's worker runs: %w", err)
	}
	if rep, err = readRoutes(ctx, db); err != nil {
		return fmt.Errorf("the route check: %w", err)
	}
	if len(rep.Findings) != 0 {
		return errorf("with both workers the route check still fails: %+v", rep.Findings)
	}
	for _, r := range rep.Routes {
		if r.Flow == stepFlow.Slug && (r.State != routes.StateOK || len(r.Workers) != 1 || r.Workers[0].FunctionName != "stepflow-"+r.Step) {
			return errorf("route %s/%s with its worker: %+v", r.Flow, r.Step, r)
		}
	}
	return nil
}
