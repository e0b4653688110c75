package worker_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

func greetFlow(slug string) worker.Flow {
	return worker.Flow{Slug: slug, Steps: []worker.Step{{Slug: "hello"}}}
}

func greetConfig(slug string) worker.Config {
	return worker.Config{
		Flow:     greetFlow(slug),
		Handlers: map[string]worker.HandlerFunc{"hello": func(context.Context, *worker.Task) (any, error) { return "hi", nil }},
	}
}

// stepGreetConfig is greetConfig's flow in step mode, served by a worker of
// its only step.
func stepGreetConfig(slug string) worker.Config {
	c := greetConfig(slug)
	c.Flow.QueueMode = worker.QueueModeStep
	c.StepSlug = "hello"
	return c
}

// rowCounts counts the rows of every table in pgflow and pgmq, so a test can
// show that nothing at all was written.
func rowCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `select pg_catalog.format('%I.%I', n.nspname, c.relname)
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		where n.nspname in ('pgflow', 'pgmq') and c.relkind in ('r', 'p') order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"pgflow.workers", "pgflow.worker_functions", "pgflow.flows"} {
		if !slices.Contains(tables, must) {
			t.Fatalf("no %s among %v", must, tables)
		}
	}
	out := map[string]int{}
	for _, tbl := range tables {
		out[tbl] = queryInt(t, pool, `select count(*) from `+tbl) // names come from the catalog, quoted by format
	}
	return out
}

// A 0.17 worker started against a 0.16.0 schema fails at its first call,
// ensure_flow_compiled with four arguments (42883), with a typed protocol
// error, before it tracks its function or registers: in both modes.
func TestStartOn016SchemaIsAProtocolErrorBeforeAnythingIsRegistered(t *testing.T) {
	db := testdb.Baseline(t)
	for name, cfg := range map[string]worker.Config{"flow mode": greetConfig("greet"), "step mode": stepGreetConfig("greet_steps")} {
		t.Run(name, func(t *testing.T) {
			before := rowCounts(t, db.Pool)
			cfg.Logger = testLogger(t)
			w, err := worker.New(db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Start(context.Background())
			if !errors.Is(err, worker.ErrProtocolMismatch) {
				t.Fatalf("Start on a 0.16.0 database: got %v, want ErrProtocolMismatch", err)
			}
			var pm *worker.ProtocolMismatchError
			if !errors.As(err, &pm) || !slices.Equal(pm.Missing, []string{"pgflow.ensure_flow_compiled(text, jsonb, text, jsonb)"}) {
				t.Fatalf("want a *ProtocolMismatchError naming ensure_flow_compiled, got %#v", pm)
			}
			var pg *pgconn.PgError
			if !errors.As(err, &pg) || pg.Code != "42883" {
				t.Fatalf("the database error is not reachable: %v", err)
			}
			<-w.Done() // a failed start leaves nothing running
			if err := w.Stop(context.Background()); err != nil {
				t.Errorf("Stop after a failed Start: %v", err)
			}
			after := rowCounts(t, db.Pool)
			for tbl, n := range before {
				if after[tbl] != n {
					t.Errorf("%s: %d rows before, %d after the refused start", tbl, n, after[tbl])
				}
			}
			if n := after["pgflow.workers"] + after["pgflow.worker_functions"] + after["pgflow.flows"]; n != 0 {
				t.Errorf("%d rows in workers, worker_functions and flows on a fresh 0.16.0 database", n)
			}
		})
	}
	err := worker.CheckProtocol(context.Background(), db.Pool)
	var pm *worker.ProtocolMismatchError
	if !errors.As(err, &pm) || !slices.Contains(pm.Missing, "pgflow.ensure_flow_compiled(text, jsonb, text, jsonb)") ||
		!slices.Contains(pm.Missing, "pgflow.start_tasks(text, bigint[], uuid, text, text)") {
		t.Errorf("CheckProtocol on 0.16.0: %v", err)
	}
}

func TestCheckProtocolOnAnUpgradedDatabase(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	if err := worker.CheckProtocol(context.Background(), db.Pool); err != nil {
		t.Fatalf("upgraded database refused: %v", err)
	}
}

func TestCheckProtocolWithoutPgflow(t *testing.T) {
	t.Parallel()
	db := testdb.PGMQ(t)
	err := worker.CheckProtocol(context.Background(), db.Pool)
	if !errors.Is(err, worker.ErrProtocolMismatch) {
		t.Fatalf("got %v, want a protocol mismatch", err)
	}
}

// Startup is upstream's: track_worker_function (with the start mode), then
// the pgflow.workers row on the canonical route; Stop marks it stopped.
func TestStartTracksAndRegistersOnTheCanonicalRoute(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	cases := []struct {
		name      string
		cfg       worker.Config
		queue     string
		startMode string
	}{
		{"flow mode, process", greetConfig("Greet"), "greet", "process"},
		{"step mode, http", func() worker.Config {
			c := stepGreetConfig("Greet_Steps")
			c.StartMode = worker.StartModeHTTP
			return c
		}(), "greet_steps__hello", "http"},
	}
	for _, tc := range cases {
		cfg := tc.cfg
		cfg.FunctionName = "svc-" + tc.queue
		cfg.Logger = testLogger(t)
		w, err := worker.New(db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := w.Start(ctx); !errors.Is(err, worker.ErrStopped) {
			t.Errorf("%s: second Start: %v", tc.name, err)
		}
		var queue, fn, mode string
		var stopped bool
		q := `select w.queue_name, w.function_name, f.start_mode, w.stopped_at is not null
		      from pgflow.workers w join pgflow.worker_functions f using (function_name) where w.worker_id = $1::uuid`
		if err := db.Pool.QueryRow(ctx, q, w.ID()).Scan(&queue, &fn, &mode, &stopped); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if queue != tc.queue || w.Queue() != tc.queue || fn != cfg.FunctionName || mode != tc.startMode || stopped {
			t.Errorf("%s: registered on %q as %q (%s), stopped=%v, Queue() %q", tc.name, queue, fn, mode, stopped, w.Queue())
		}
		if err := w.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := db.Pool.QueryRow(ctx, q, w.ID()).Scan(&queue, &fn, &mode, &stopped); err != nil || !stopped {
			t.Errorf("%s: after Stop: stopped=%v, %v", tc.name, stopped, err)
		}
		if err := w.Err(); err != nil {
			t.Errorf("%s: Err after a clean stop: %v", tc.name, err)
		}
	}
}

// assertNotRegistered: nothing of the worker reached pgflow.workers or
// pgflow.worker_functions.
func assertNotRegistered(t *testing.T, pool *pgxpool.Pool, fn string) {
	t.Helper()
	if n := queryInt(t, pool, `select count(*) from pgflow.workers where function_name = $1`, fn); n != 0 {
		t.Errorf("%d workers registered as %q", n, fn)
	}
	if n := queryInt(t, pool, `select count(*) from pgflow.worker_functions where function_name = $1`, fn); n != 0 {
		t.Errorf("function %q tracked", fn)
	}
}

func TestShapeMismatchIsTypedAndNothingIsRegistered(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	res, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("greet"))
	if err != nil || res.Status != worker.StatusCompiled {
		t.Fatalf("first EnsureFlow: %+v, %v", res, err)
	}
	if res, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("greet")); err != nil || res.Status != worker.StatusVerified {
		t.Fatalf("second EnsureFlow: %+v, %v", res, err)
	}

	cfg := greetConfig("greet")
	cfg.Flow.Steps[0].Type = worker.StepMap
	cfg.FunctionName = "mismatched"
	cfg.Logger = testLogger(t)
	w, err := worker.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Start(ctx)
	var sm *worker.FlowShapeMismatchError
	var rm *worker.FlowRoutingMismatchError
	if !errors.Is(err, worker.ErrFlowMismatch) || !errors.As(err, &sm) || len(sm.Differences) == 0 || errors.As(err, &rm) {
		t.Fatalf("got %v, want a *FlowShapeMismatchError with differences", err)
	}
	assertNotRegistered(t, db.Pool, "mismatched")
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.steps where flow_slug = 'greet' and step_type = 'single'`); n != 1 {
		t.Error("the stored flow changed")
	}
}

// The same shape in the other queue mode is a routing mismatch, both ways:
// the stored route map (queue mode and step → queue list) differs from the
// worker's.
func TestRoutingMismatchIsTypedAndNothingIsRegistered(t *testing.T) {
	t.Parallel()
	db := upgraded(t)
	ctx := context.Background()
	cases := []struct{ stored, started worker.Config }{
		{greetConfig("as_flow"), stepGreetConfig("as_flow")},
		{stepGreetConfig("as_steps"), greetConfig("as_steps")},
	}
	for _, tc := range cases {
		slug := tc.stored.Flow.Slug
		if res, err := worker.EnsureFlow(ctx, db.Pool, tc.stored.Flow); err != nil || res.Status != worker.StatusCompiled {
			t.Fatalf("%s: compiling: %+v, %v", slug, res, err)
		}
		cfg := tc.started
		cfg.FunctionName = "rerouted-" + slug
		cfg.Logger = testLogger(t)
		w, err := worker.New(db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = w.Start(ctx)
		var rm *worker.FlowRoutingMismatchError
		var sm *worker.FlowShapeMismatchError
		if !errors.Is(err, worker.ErrFlowMismatch) || !errors.As(err, &rm) || errors.As(err, &sm) {
			t.Fatalf("%s: got %v, want a *FlowRoutingMismatchError", slug, err)
		}
		assertNotRegistered(t, db.Pool, cfg.FunctionName)
		var mode string
		if err := db.Pool.QueryRow(ctx, `select queue_mode from pgflow.flows where flow_slug = $1`, slug).Scan(&mode); err != nil ||
			mode != string(tc.stored.Flow.QueueMode) && !(mode == "flow" && tc.stored.Flow.QueueMode == "") {
			t.Errorf("%s: stored queue mode now %q (%v)", slug, mode, err)
		}
	}
}
