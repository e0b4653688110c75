package upgrade_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// testCtx bounds a test: a hang fails the test instead of the binary.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// inflightDB is a fresh database in the fixtures' inflight state.
func inflightDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.PGMQ(t)
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), db.Pool); err != nil {
		t.Fatalf("loading inflight: %v", err)
	}
	return db
}

// connect opens one connection to db (closed at cleanup).
func connect(t *testing.T, db *testdb.DB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// fingerprint is the catalog of schemas pgflow, pgmq and supabase_migrations
// (relations, columns, constraints, indexes, functions with their source,
// triggers, types) and an md5 of every row of every table in them, ordered.
// Equal fingerprints: the database is as it was.
func fingerprint(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	q := func(sql string) {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatalf("fingerprint: %v\n%s", err, sql)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("fingerprint: %v", err)
		}
		for _, l := range lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	const schemas = `('pgflow', 'pgmq', 'supabase_migrations')`
	q(`select 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text
	     from pg_class c join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + schemas + ` order by 1`)
	q(`select 'col ' || n.nspname || '.' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull
	     from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + schemas + ` and a.attnum > 0 and not a.attisdropped order by 1`)
	q(`select 'con ' || n.nspname || '.' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
	     from pg_constraint k join pg_class c on c.oid = k.conrelid join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + schemas + ` order by 1`)
	q(`select 'idx ' || pg_get_indexdef(i.indexrelid)
	     from pg_index i join pg_class c on c.oid = i.indrelid join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + schemas + ` order by 1`)
	q(`select 'fn ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc)
	     from pg_proc p join pg_namespace n on n.oid = p.pronamespace
	    where n.nspname in ` + schemas + ` order by 1`)
	q(`select 'trg ' || t.tgrelid::regclass::text || ' ' || t.tgname
	     from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + schemas + ` and not t.tgisinternal order by 1`)
	q(`select 'type ' || n.nspname || '.' || t.typname
	     from pg_type t join pg_namespace n on n.oid = t.typnamespace
	    where n.nspname in ` + schemas + ` order by 1`)
	rows, err := pool.Query(ctx, `select format('%I.%I', n.nspname, c.relname)
	     from pg_class c join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in `+schemas+` and c.relkind in ('r', 'p') order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		var sum string
		// Table names come from the catalog, quoted by format('%I').
		if err := pool.QueryRow(ctx, `select coalesce(md5(string_agg(x::text, '|' order by x::text)), 'empty') from `+tbl+` x`).Scan(&sum); err != nil {
			t.Fatalf("fingerprint %s: %v", tbl, err)
		}
		b.WriteString("data " + tbl + " " + sum + "\n")
	}
	return b.String()
}

// diffLines shows the lines of a that are not in b and vice versa.
func diffLines(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l := range ma {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range mb {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

func assertSame(t *testing.T, before, after, what string) {
	t.Helper()
	if before != after {
		t.Fatalf("%s: the database changed:\n%s", what, diffLines(before, after))
	}
}
