package online_test

// apply --online still targets the project's OLD model of 0.16.0 and its old
// migration (flows.queue_name, claim_tasks): its phases are retargeted at
// pgflow 0.17.0 separately. Until then its tests run on testdb's model with
// that old migration, kept here privately (testdata/model_migration, with its
// atlas.sum), injected into the switch through upgrade.Options. Nothing
// outside these tests uses it.

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

//go:embed testdata/model_migration
var modelFiles embed.FS

func modelFS() fs.FS {
	sub, err := fs.Sub(modelFiles, "testdata/model_migration")
	if err != nil {
		panic(err)
	}
	return sub
}

// modelMigrations is the old migration (for the model only).
func modelMigrations() ([]migrations.Migration, error) {
	b, err := fs.ReadFile(modelFS(), "20261202120000_pgflow_persist_queue.sql")
	if err != nil {
		return nil, err
	}
	return []migrations.Migration{{Version: "20261202120000", Name: "pgflow_persist_queue",
		File: "20261202120000_pgflow_persist_queue.sql", SQL: string(b)}}, nil
}

// modelState: the old migration's end state (pgflow.schema_revisions,
// written by that file) is "upgraded"; anything else as the audit sees it.
func modelState(ctx context.Context, q upgrade.Querier) (audit.SchemaInfo, error) {
	var done bool
	if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow.schema_revisions') is not null`).Scan(&done); err != nil {
		return audit.SchemaInfo{}, err
	}
	if done {
		return audit.SchemaInfo{State: audit.StateUpgraded, HasTables: true, Differences: []string{}}, nil
	}
	return audit.DetectSchema(ctx, q)
}

// modelChecks are the old migration's post-conditions.
func modelChecks() []upgrade.Check {
	fn := func(sig string) string {
		return `select pg_catalog.to_regprocedure('` + sig + `') is not null, '` + sig + `'`
	}
	gone := func(sig string) string {
		return `select pg_catalog.to_regprocedure('` + sig + `') is null, '` + sig + `'`
	}
	return []upgrade.Check{
		{ID: "flows_queue_name", SQL: `select not exists (select 1 from pgflow.flows where queue_name is distinct from flow_slug), 'flows'`},
		{ID: "step_tasks_queue_name_not_null", SQL: `select a.attnotnull, 'step_tasks.queue_name' from pg_catalog.pg_attribute a
			where a.attrelid = 'pgflow.step_tasks'::regclass and a.attname = 'queue_name'`},
		{ID: "claim_tasks", SQL: fn("pgflow.claim_tasks(text, uuid, integer, integer, integer, integer)")},
		{ID: "old_start_tasks_gone", SQL: gone("pgflow.start_tasks(text,bigint[],uuid)")},
		{ID: "old_ensure_flow_compiled_gone", SQL: gone("pgflow.ensure_flow_compiled(text,jsonb)")},
		{ID: "revision", SQL: `select exists (select 1 from pgflow.schema_revisions where version = '20261202120000'), 'revision'`},
		{ID: "no_step_tasks_trigger", SQL: `select count(*) = 0, 'triggers' from pg_catalog.pg_trigger t
			where t.tgrelid = 'pgflow.step_tasks'::regclass and not t.tgisinternal`},
	}
}

// withModel points the switch of apply --online at the old migration.
func withModel(o online.Options) online.Options {
	o.Switch.Migrations = modelMigrations
	o.Switch.Verify = func() error { return migrations.VerifyFS(modelFS()) }
	o.Switch.PostConditions = modelChecks
	o.Switch.State = modelState
	return o
}

// verifyModel runs the old post-conditions, read-only.
func verifyModel(t *testing.T, db *testdb.DB) {
	t.Helper()
	ctx := context.Background()
	for _, c := range modelChecks() {
		var ok bool
		var detail string
		if err := db.Pool.QueryRow(ctx, c.SQL).Scan(&ok, &detail); err != nil || !ok {
			t.Fatalf("post-condition %s: %v (%s)", c.ID, err, detail)
		}
	}
}

// modelMigrationSQL is the old file's text (for the hand-run test).
func modelMigrationSQL(t *testing.T) string {
	t.Helper()
	ms, err := modelMigrations()
	if err != nil {
		t.Fatal(err)
	}
	return ms[0].SQL
}

// runFile runs sql as one transaction on conn.
func runFile(ctx context.Context, conn *pgx.Conn, sql string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("the old migration: %w", err)
		}
		return nil
	})
}

func TestModelMigrationIntegrity(t *testing.T) {
	if err := migrations.VerifyFS(modelFS()); err != nil {
		t.Fatalf("the old migration in testdata does not match its atlas.sum: %v", err)
	}
}
