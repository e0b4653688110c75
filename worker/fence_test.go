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
	if !slices.Contains(tables, "pgflow.workers") || !slices.Contains(tables, "pgflow.flows") {
		t.Fatalf("unexpected tables: %v", tables)
	}
	out := map[string]int{}
	for _, tbl := range tables {
		out[tbl] = queryInt(t, pool, `select count(*) from `+tbl) // names come from the catalog, quoted by format
	}
	return out
}

func TestStartOnBaselineIsFencedBeforeAnythingIsWritten(t *testing.T) {
	db := testdb.Model(t)
	before := rowCounts(t, db.Pool)

	cfg := greetConfig("greet")
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
	if !errors.As(err, &pm) || pm.Got != 0 || pm.Want != worker.ProtocolVersion {
		t.Fatalf("want a *ProtocolMismatchError without a version, got %#v", pm)
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
	if n := after["pgflow.workers"] + after["pgflow.flows"]; n != 0 {
		t.Errorf("%d workers/flows rows on a fresh baseline", n)
	}

	// The helpers are fenced the same way.
	if err := worker.CheckProtocol(context.Background(), db.Pool); !errors.Is(err, worker.ErrProtocolMismatch) {
		t.Errorf("CheckProtocol: %v", err)
	}
	if _, err := worker.EnsureFlow(context.Background(), db.Pool, greetFlow("greet")); !errors.Is(err, worker.ErrProtocolMismatch) {
		t.Errorf("EnsureFlow (3-argument call on 0.16.0): %v", err)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.flows`); n != 0 {
		t.Errorf("EnsureFlow wrote %d flows", n)
	}
}

func TestFenceOnDatabaseWithoutPgflow(t *testing.T) {
	db := testdb.PGMQ(t)
	err := worker.CheckProtocol(context.Background(), db.Pool)
	var pg *pgconn.PgError
	if !errors.Is(err, worker.ErrProtocolMismatch) || !errors.As(err, &pg) || pg.Code != "3F000" {
		t.Fatalf("got %v, want a protocol mismatch wrapping 3F000", err)
	}
}

func TestFenceListsMissingFunctions(t *testing.T) {
	db := upgraded(t)
	ctx := context.Background()
	if err := worker.CheckProtocol(ctx, db.Pool); err != nil {
		t.Fatalf("upgraded database refused: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, `drop function pgflow.release_task(uuid, text, integer, uuid)`); err != nil {
		t.Fatal(err)
	}
	err := worker.CheckProtocol(ctx, db.Pool)
	var pm *worker.ProtocolMismatchError
	if !errors.As(err, &pm) || !slices.Equal(pm.Missing, []string{"pgflow.release_task(uuid,text,integer,uuid)"}) || pm.Got != 2 {
		t.Fatalf("got %v (%#v)", err, pm)
	}
}

func TestFlowShapeMismatchIsTypedAndNotRegistered(t *testing.T) {
	db := upgraded(t)
	ctx := context.Background()
	res, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("greet"))
	if err != nil || res.Status != worker.StatusCompiled {
		t.Fatalf("first EnsureFlow: %+v, %v", res, err)
	}
	var queue string
	if err := db.Pool.QueryRow(ctx, `select queue_name from pgflow.flows where flow_slug = 'greet'`).Scan(&queue); err != nil || queue != "greet" {
		t.Fatalf("flow queue %q, %v", queue, err)
	}
	if res, err := worker.EnsureFlow(ctx, db.Pool, greetFlow("greet")); err != nil || res.Status != worker.StatusVerified {
		t.Fatalf("second EnsureFlow: %+v, %v", res, err)
	}

	cfg := greetConfig("greet")
	cfg.Flow.Steps[0].Type = worker.StepMap
	cfg.Logger = testLogger(t)
	w, err := worker.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Start(ctx)
	var fm *worker.FlowMismatchError
	if !errors.Is(err, worker.ErrFlowMismatch) || !errors.As(err, &fm) || len(fm.Differences) == 0 {
		t.Fatalf("got %v, want a *FlowMismatchError with differences", err)
	}
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.workers`); n != 0 {
		t.Errorf("%d workers registered after a shape mismatch", n)
	}
}

func TestStartRegistersAndStopMarksStopped(t *testing.T) {
	db := upgraded(t)
	ctx := context.Background()
	cfg := greetConfig("greet")
	cfg.FunctionName = "svc-greeter"
	cfg.Logger = testLogger(t)
	w, err := worker.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); !errors.Is(err, worker.ErrStopped) {
		t.Errorf("second Start: %v", err)
	}
	var queue, fn string
	var stopped bool
	q := `select queue_name, function_name, stopped_at is not null from pgflow.workers where worker_id = $1::uuid`
	if err := db.Pool.QueryRow(ctx, q, w.ID()).Scan(&queue, &fn, &stopped); err != nil {
		t.Fatal(err)
	}
	if queue != "greet" || fn != "svc-greeter" || stopped || w.Queue() != "greet" {
		t.Errorf("registered as %q/%q stopped=%v (Queue() %q)", queue, fn, stopped, w.Queue())
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, q, w.ID()).Scan(&queue, &fn, &stopped); err != nil || !stopped {
		t.Errorf("after Stop: stopped=%v, %v", stopped, err)
	}
	if err := w.Err(); err != nil {
		t.Errorf("Err after a clean stop: %v", err)
	}
}
