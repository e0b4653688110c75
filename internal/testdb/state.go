package testdb

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stateSchemas are the schemas State reads in full.
const stateSchemas = `('pgflow', 'pgmq', 'supabase_migrations')`

// State is what "the database is unchanged" compares: every schema and
// extension, and for schemas pgflow, pgmq and supabase_migrations their
// relations (kind, owner, ACL), columns (type, NOT NULL, default),
// constraints, indexes, functions (source md5 and settings), triggers and
// types, plus an md5 of every row of every table, in order. One line per
// object, so SameState can show what differs.
//
// It answers "did anything change at all"; internal/fingerprint answers
// "which rows changed, and are the new columns right" across an upgrade.
func State(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	lines := func(sql string) []string {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatalf("testdb.State: %v\n%s", err, sql)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("testdb.State: %v", err)
		}
		return out
	}
	for _, sql := range []string{
		`select 'schema ' || nspname from pg_namespace order by 1`,
		`select 'ext ' || extname || ' ' || extversion from pg_extension order by 1`,
		`select 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text || ' ' || pg_get_userbyid(c.relowner) || ' ' || coalesce(c.relacl::text, '')
		   from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname in ` + stateSchemas + ` order by 1`,
		`select 'col ' || n.nspname || '.' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
		   from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
		   left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
		  where n.nspname in ` + stateSchemas + ` and a.attnum > 0 and not a.attisdropped order by 1`,
		`select 'con ' || n.nspname || '.' || c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
		   from pg_constraint k join pg_class c on c.oid = k.conrelid join pg_namespace n on n.oid = c.relnamespace
		  where n.nspname in ` + stateSchemas + ` order by 1`,
		`select 'idx ' || pg_get_indexdef(i.indexrelid)
		   from pg_index i join pg_class c on c.oid = i.indrelid join pg_namespace n on n.oid = c.relnamespace
		  where n.nspname in ` + stateSchemas + ` order by 1`,
		`select 'fn ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc) || ' ' || coalesce(p.proconfig::text, '')
		   from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname in ` + stateSchemas + ` order by 1`,
		`select 'trg ' || t.tgrelid::regclass::text || ' ' || t.tgname
		   from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
		  where n.nspname in ` + stateSchemas + ` and not t.tgisinternal order by 1`,
		`select 'type ' || n.nspname || '.' || t.typname from pg_type t join pg_namespace n on n.oid = t.typnamespace
		  where n.nspname in ` + stateSchemas + ` order by 1`,
	} {
		for _, l := range lines(sql) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	tables := lines(`select format('%I.%I', n.nspname, c.relname)
	     from pg_class c join pg_namespace n on n.oid = c.relnamespace
	    where n.nspname in ` + stateSchemas + ` and c.relkind in ('r', 'p') order by 1`)
	for _, tbl := range tables {
		var sum string
		// Names come from the catalog, quoted by format('%I').
		if err := pool.QueryRow(ctx, `select coalesce(md5(string_agg(x::text, '|' order by x::text)), 'empty') from `+tbl+` x`).Scan(&sum); err != nil {
			t.Fatalf("testdb.State %s: %v", tbl, err)
		}
		b.WriteString("data " + tbl + " " + sum + "\n")
	}
	return b.String()
}

// SameState fails the test when two States differ, listing the lines only
// before has ("- ") and only after has ("+ ").
func SameState(t testing.TB, before, after, what string) {
	t.Helper()
	if before == after {
		return
	}
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	mb, ma := set(before), set(after)
	var d []string
	for l := range mb {
		if !ma[l] {
			d = append(d, "- "+l)
		}
	}
	for l := range ma {
		if !mb[l] {
			d = append(d, "+ "+l)
		}
	}
	sort.Strings(d)
	t.Fatalf("%s: the database changed:\n%s", what, strings.Join(d, "\n"))
}
