package migrations_test

// SQL-level tests of the migration on fresh real pgflow 0.16.0 databases
// (testdb.Baseline): the file is applied as one multi-statement Exec inside
// a transaction, the way psql -1 or the Supabase CLI would.

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

type q = session.Querier

// migrationFile is the one embedded migration.
func migrationFile(t *testing.T) migrations.Migration {
	t.Helper()
	all, err := migrations.All()
	if err != nil || len(all) != 1 {
		t.Fatalf("embedded migrations: %v (%d files, want 1)", err, len(all))
	}
	if _, err := os.Stat(all[0].File); err != nil {
		t.Fatal(err)
	}
	return all[0]
}

// applyMigration runs the file in one transaction and commits it.
func applyMigration(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if err := tryMigration(t, pool); err != nil {
		t.Fatalf("applying the migration: %v", err)
	}
}

func tryMigration(t *testing.T, pool *pgxpool.Pool) error {
	t.Helper()
	m := migrationFile(t)
	return pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), m.SQL)
		return err
	})
}

func scalar[T any](t *testing.T, db q, sql string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return v
}

func pgCode(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// fingerprint digests the pgflow catalog (columns, constraints, indexes,
// function bodies) and every row and queue, to prove a refused run changed
// nothing.
func fingerprint(t *testing.T, db q) string {
	t.Helper()
	return scalar[string](t, db, `select md5(concat_ws('|',
		(select string_agg(format('%s.%s:%s:%s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull), ',' order by c.relname, a.attnum)
		   from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
		  where n.nspname = 'pgflow' and a.attnum > 0 and not a.attisdropped),
		(select string_agg(pg_get_indexdef(i.indexrelid), ',' order by 1)
		   from pg_index i join pg_class c on c.oid = i.indrelid join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'pgflow'),
		(select string_agg(pg_get_constraintdef(k.oid), ',' order by 1)
		   from pg_constraint k join pg_namespace n on n.oid = k.connamespace where n.nspname = 'pgflow'),
		(select string_agg(p.oid::regprocedure::text || md5(p.prosrc), ',' order by 1)
		   from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'pgflow'),
		(select string_agg(f::text, ',' order by f::text) from pgflow.flows f),
		(select string_agg(s::text, ',' order by s::text) from pgflow.steps s),
		(select string_agg(st::text, ',' order by st::text) from pgflow.step_tasks st),
		(select string_agg(m::text, ',' order by m::text) from pgmq.meta m)))`)
}
