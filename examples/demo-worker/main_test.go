package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func noEnv(string) string { return "" }

func TestDemoRunsTheFlowOnAnUpgradedDatabase(t *testing.T) {
	db := testdb.Model(t)
	ctx := context.Background()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("applying %s: %v", m.File, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

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

func TestDemoRefusesA016Database(t *testing.T) {
	db := testdb.Model(t)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"--dsn", db.DSN, "--run", `{"names":["Ada"]}`}, noEnv, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "pgflow-upgrade apply") {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
}

func TestDemoUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"--run", "{"}, {"--bogus"}, {}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, noEnv, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}
