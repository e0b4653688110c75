package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func noEnv(string) string { return "" }

// upgraded is a pgflow 0.16.0 database with the embedded migration applied.
func upgraded(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	testdb.Migrate(t, db.Pool)
	return db
}

func TestDemoRunsTheFlowOnAnUpgradedDatabase(t *testing.T) {
	db := upgraded(t)
	ctx := context.Background()

	var out, errOut bytes.Buffer
	code := run(ctx, []string{"--dsn", db.DSN, "--run", `{"names":["Ada"," Grace ",""]}`}, noEnv, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	want := `{"summary": {"text": "Hello, Ada! Hello, Grace!", "count": 2}}`
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("output %s, want %s", got, want)
	}
	var stopped int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.workers where function_name = 'demo-worker' and stopped_at is not null`).Scan(&stopped); err != nil || stopped != 1 {
		t.Errorf("demo worker not marked stopped: %d, %v", stopped, err)
	}
}

// In step mode each step has its own queue and its own worker.
func TestDemoRunsTheFlowInStepMode(t *testing.T) {
	db := upgraded(t)
	ctx := context.Background()
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"--dsn", db.DSN, "--queue-mode", "step", "--run", `{"names":["Ada","Grace"]}`}, noEnv, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	want := `{"summary": {"text": "Hello, Ada! Hello, Grace!", "count": 2}}`
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("output %s, want %s", got, want)
	}
	var queues string
	if err := db.Pool.QueryRow(ctx, `select string_agg(queue_name, ',' order by queue_name) from pgflow.workers
		where function_name = 'demo-worker' and stopped_at is not null`).Scan(&queues); err != nil {
		t.Fatal(err)
	}
	if queues != "demo_greetings_by_step__greet,demo_greetings_by_step__names,demo_greetings_by_step__summary" {
		t.Errorf("stopped workers on queues %s, want one per step", queues)
	}
}

func TestDemoRefusesA016Database(t *testing.T) {
	db := testdb.Baseline(t)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--dsn", db.DSN, "--run", `{"names":["Ada"]}`}, noEnv, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "pgflow-upgrade apply") {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

func TestDemoUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"--run", "{"}, {"--bogus"}, {}, {"--queue-mode", "queue", "--dsn", "postgres://x@localhost/db"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, noEnv, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}
