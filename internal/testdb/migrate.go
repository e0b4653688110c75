package testdb

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// Migrate applies the embedded migrations to a database in one transaction,
// the way a migration runner (psql -1, the Supabase CLI) would run the files:
// none of apply's locks, preflight or bookkeeping. The statements in after
// run in the same transaction, after the migrations (e.g. to sabotage the
// result in a test of a check).
func Migrate(t testing.TB, pool *pgxpool.Pool, after ...string) {
	t.Helper()
	ctx := context.Background()
	all, err := migrations.All()
	if err != nil || len(all) == 0 {
		t.Fatalf("testdb: embedded migrations: %v (%d files)", err, len(all))
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("testdb: migrating: %v", err)
	}
	defer tx.Rollback(ctx)
	for _, m := range all {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("testdb: applying %s: %v", m.File, err)
		}
	}
	for _, s := range after {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("testdb: after the migrations: %v", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("testdb: committing the migrations: %v", err)
	}
}
