package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Querier is a connection, a pool or a transaction. Read runs in a
// transaction of its own (a savepoint when q is already a transaction), so
// it can pin search_path to ” for that transaction only and leave the
// caller's setting as it was.
type Querier = session.Querier

type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrNoBegin: Read was given a Querier that cannot open a transaction.
var ErrNoBegin = errors.New("catalog.Read needs a connection, pool or transaction (something with Begin)")

// Read reads schema's catalog from a live database: the same JSON form as
// the embedded version catalogs, produced by one catalog query (pg_catalog only, no lock on
// any table of the schema, works with a role that can only read). With
// search_path = ” every pg_get_* text names objects outside pg_catalog
// with their schema; every sort is COLLATE "C". A schema that does not
// exist reads as an empty catalog (see Exists).
//
// Deparsing a table's constraints, indexes and defaults takes ACCESS SHARE
// on it: under the caller's lock_timeout, Read fails with 55P03 while
// another session holds a table ACCESS EXCLUSIVE (see ReadShallow).
func Read(ctx context.Context, q Querier, schema string) (*Catalog, error) {
	return read(ctx, q, schema, false)
}

func read(ctx context.Context, q Querier, schema string, shallow bool) (*Catalog, error) {
	sql := readSQL
	if shallow {
		sql = shallowSQL
	}
	c, err := query(ctx, q, schema, sql)
	if err != nil {
		return nil, err
	}
	c.Shallow = shallow
	return c, nil
}

// query runs one of the catalog queries with args after the schema.
func query(ctx context.Context, q Querier, schema, sql string, args ...any) (*Catalog, error) {
	if tx, ok := q.(pgx.Tx); ok {
		return queryInTx(ctx, tx, schema, sql, args...)
	}
	b, ok := q.(beginner)
	if !ok {
		return nil, ErrNoBegin
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: opening a transaction: %w", schema, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) // read only: nothing to keep
	if err := session.EmptySearchPath(ctx, tx); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: pinning search_path: %w", schema, err)
	}
	var raw []byte
	if err := tx.QueryRow(ctx, sql, append([]any{schema}, args...)...).Scan(&raw); err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s from pg_catalog: %w", schema, err)
	}
	c, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	return c, nil
}

// ReadShallow is Read without the texts PostgreSQL can only deparse under
// an ACCESS SHARE lock on the table (constraint, index, trigger and view
// definitions, generated-column expressions): it never waits for a lock,
// so it works while another session holds a pgflow table ACCESS
// EXCLUSIVE. Those definitions read as ""; Shallow is set, and Diff and
// Missing compare them only by name.
func ReadShallow(ctx context.Context, q Querier, schema string) (*Catalog, error) {
	return read(ctx, q, schema, true)
}

// IsLockTimeout: err is a lock wait that ran out (SQLSTATE 55P03), e.g.
// Read under a lock_timeout while a table of the schema is locked.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

var (
	deparse = []string{
		"{{default}}", "pg_catalog.pg_get_expr(ad.adbin, ad.adrelid)",
		"{{condef}}", "pg_catalog.pg_get_constraintdef(k.oid)",
		"{{indexdef}}", "pg_catalog.pg_get_indexdef(ic.oid)",
		"{{triggerdef}}", "pg_catalog.pg_get_triggerdef(tg.oid)",
		"{{viewdef}}", "pg_catalog.pg_get_viewdef(c.oid)"}
	// The whole schema: no filter.
	whole = []string{"{{tables}}", "", "{{table_of_sequence}}", "", "{{functions}}", "", "{{others}}", ""}
	// A Scope: $2 the tables, $3 the function names; nothing else.
	scoped = []string{
		"{{tables}}", "and c.relname operator(pg_catalog.=) any($2::pg_catalog.text[])",
		"{{table_of_sequence}}", "and t.relname operator(pg_catalog.=) any($2::pg_catalog.text[])",
		"{{functions}}", "and p.proname operator(pg_catalog.=) any($3::pg_catalog.text[])",
		"{{others}}", "and false"}
	readSQL = strings.NewReplacer(append(deparse, whole...)...).Replace(catalogSQL)
	// A default cannot refer to a column, so relid 0 deparses it without
	// opening the table; a generated column's expression can, so it is left out.
	shallowSQL = strings.NewReplacer(append([]string{
		"{{default}}", "case when a.attgenerated = '' then pg_catalog.pg_get_expr(ad.adbin, 0) end",
		"{{condef}}", "''",
		"{{indexdef}}", "''",
		"{{triggerdef}}", "''",
		"{{viewdef}}", "''"}, whole...)...).Replace(catalogSQL)
	scopeSQL = strings.NewReplacer(append(deparse, scoped...)...).Replace(catalogSQL)
)

// queryInTx is query inside the caller's transaction, as one pipeline
// (a pgx batch: one round trip, where a transaction may hold locks the
// application waits on): a savepoint, search_path ” for it, the query,
// and the rollback to the savepoint, which gives search_path back.
func queryInTx(ctx context.Context, tx pgx.Tx, schema, sql string, args ...any) (*Catalog, error) {
	return queryInTxPlan(ctx, tx, false, schema, sql, args...)
}

// queryInTxPlan is queryInTx; generic runs sql (then a prepared
// statement's name) on its generic plan, planned once and kept.
func queryInTxPlan(ctx context.Context, tx pgx.Tx, generic bool, schema, sql string, args ...any) (*Catalog, error) {
	b := &pgx.Batch{}
	b.Queue(`savepoint pgflow_upgrade_catalog_read`)
	if generic {
		b.Queue(`select pg_catalog.set_config('search_path', '', true), pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true)`)
	} else {
		b.Queue(`select pg_catalog.set_config('search_path', '', true)`)
	}
	b.Queue(sql, append([]any{schema}, args...)...)
	b.Queue(`rollback to savepoint pgflow_upgrade_catalog_read`)
	br := tx.SendBatch(ctx, b)
	var raw []byte
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("opening a savepoint: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("pinning search_path: %w", err)
		}
		if err := br.QueryRow().Scan(&raw); err != nil {
			return fmt.Errorf("from pg_catalog: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("rolling back to the savepoint: %w", err)
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		// A statement that failed leaves the savepoint to roll back to
		// (or the transaction aborted, which the caller rolls back).
		_, _ = tx.Exec(context.WithoutCancel(ctx), `rollback to savepoint pgflow_upgrade_catalog_read`)
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	c, err := Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("reading the catalog of schema %s: %w", schema, err)
	}
	return c, nil
}

// Exists reports whether schema exists (catalog rows only).
func Exists(ctx context.Context, q Querier, schema string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_namespace where nspname = $1)`, schema).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("looking for schema %s: %w", schema, err)
	}
	return ok, nil
}

// catalogSQL builds the whole catalog as one jsonb value; $1 is the
// schema. Each part lists one kind of object, ordered as the format says
// (names COLLATE "C"; columns and attributes by attnum). The {{...}}
// placeholders are the texts that deparse an expression of a table.
const catalogSQL = `
with ns as (select n.oid from pg_catalog.pg_namespace n where n.nspname = $1),
tables as (
  select c.relname, pg_catalog.jsonb_build_object(
    'name', c.relname,
    'kind', case when c.relkind = 'p' then 'partitioned table' else 'table' end,
    'columns', coalesce((
      select pg_catalog.jsonb_agg(
               pg_catalog.jsonb_build_object(
                 'name', a.attname,
                 'type', pg_catalog.format_type(a.atttypid, a.atttypmod),
                 'not_null', a.attnotnull,
                 'default', {{default}})
               || case a.attidentity
                    when 'a' then pg_catalog.jsonb_build_object('identity', 'always')
                    when 'd' then pg_catalog.jsonb_build_object('identity', 'by default')
                    else '{}'::jsonb end
               || case when a.attgenerated <> '' then pg_catalog.jsonb_build_object('generated', 'stored')
                    else '{}'::jsonb end
               order by a.attnum)
      from pg_catalog.pg_attribute a
      left join pg_catalog.pg_attrdef ad on ad.adrelid = a.attrelid and ad.adnum = a.attnum
      where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped), '[]'::jsonb),
    'constraints', coalesce((
      select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', k.conname, 'contype', k.contype, 'definition', {{condef}})
               order by k.conname collate "C", {{condef}} collate "C")
      from pg_catalog.pg_constraint k where k.conrelid = c.oid), '[]'::jsonb),
    'indexes', coalesce((
      select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', ic.relname, 'definition', {{indexdef}})
               order by ic.relname collate "C")
      from pg_catalog.pg_index x join pg_catalog.pg_class ic on ic.oid = x.indexrelid
      where x.indrelid = c.oid), '[]'::jsonb)) as j
  from pg_catalog.pg_class c
  where c.relnamespace = (select oid from ns) and c.relkind in ('r', 'p') {{tables}}
),
ctypes as (
  select t.typname, pg_catalog.jsonb_build_object(
    'name', t.typname,
    'attributes', coalesce((
      select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', a.attname, 'type', pg_catalog.format_type(a.atttypid, a.atttypmod)) order by a.attnum)
      from pg_catalog.pg_attribute a
      where a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped), '[]'::jsonb)) as j
  from pg_catalog.pg_type t join pg_catalog.pg_class c on c.oid = t.typrelid
  where t.typnamespace = (select oid from ns) and t.typtype = 'c' and c.relkind = 'c' {{others}}
),
enums as (
  select t.typname, pg_catalog.jsonb_build_object(
    'name', t.typname,
    'labels', coalesce((select pg_catalog.jsonb_agg(e.enumlabel order by e.enumsortorder)
                        from pg_catalog.pg_enum e where e.enumtypid = t.oid), '[]'::jsonb)) as j
  from pg_catalog.pg_type t
  where t.typnamespace = (select oid from ns) and t.typtype = 'e' {{others}}
),
domains as (
  select t.typname, pg_catalog.jsonb_build_object(
    'name', t.typname,
    'type', pg_catalog.format_type(t.typbasetype, t.typtypmod),
    'not_null', t.typnotnull,
    'default', t.typdefault,
    'constraints', coalesce((
      select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', k.conname, 'definition', pg_catalog.pg_get_constraintdef(k.oid)) order by k.conname collate "C")
      from pg_catalog.pg_constraint k where k.contypid = t.oid), '[]'::jsonb)) as j
  from pg_catalog.pg_type t
  where t.typnamespace = (select oid from ns) and t.typtype = 'd' {{others}}
),
functions as (
  select p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid) as ident, pg_catalog.jsonb_build_object(
    'name', p.proname,
    'kind', case p.prokind when 'f' then 'function' when 'p' then 'procedure'
                           when 'a' then 'aggregate' when 'w' then 'window' end,
    'identity_arguments', pg_catalog.pg_get_function_identity_arguments(p.oid),
    'arguments', pg_catalog.pg_get_function_arguments(p.oid),
    'result', pg_catalog.pg_get_function_result(p.oid),
    'language', l.lanname,
    'volatility', case p.provolatile when 'i' then 'immutable' when 's' then 'stable' else 'volatile' end,
    'strict', p.proisstrict,
    'security_definer', p.prosecdef,
    'leakproof', p.proleakproof,
    'parallel', case p.proparallel when 's' then 'safe' when 'r' then 'restricted' else 'unsafe' end,
    'config', (select pg_catalog.jsonb_agg(s order by s collate "C") from pg_catalog.unnest(p.proconfig) as s)) as j
  from pg_catalog.pg_proc p join pg_catalog.pg_language l on l.oid = p.prolang
  where p.pronamespace = (select oid from ns) {{functions}}
),
triggers as (
  select c.relname, tg.tgname, pg_catalog.jsonb_build_object(
    'name', tg.tgname, 'table', c.relname, 'definition', {{triggerdef}}) as j
  from pg_catalog.pg_trigger tg join pg_catalog.pg_class c on c.oid = tg.tgrelid
  where c.relnamespace = (select oid from ns) and not tg.tgisinternal {{tables}}
),
sequences as (
  select pg_catalog.format('%I.%I', sn.nspname, s.relname) as name, pg_catalog.jsonb_build_object(
    'name', pg_catalog.format('%I.%I', sn.nspname, s.relname),
    'owned_by', pg_catalog.format('%I.%I', t.relname, a.attname),
    'identity', d.deptype = 'i',
    'type', pg_catalog.format_type(q.seqtypid, null),
    'start', q.seqstart, 'increment', q.seqincrement, 'min', q.seqmin, 'max', q.seqmax,
    'cache', q.seqcache, 'cycle', q.seqcycle) as j
  from pg_catalog.pg_class s
  join pg_catalog.pg_namespace sn on sn.oid = s.relnamespace
  join pg_catalog.pg_sequence q on q.seqrelid = s.oid
  join pg_catalog.pg_depend d on d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass and d.objid = s.oid
   and d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass and d.deptype in ('a', 'i')
  join pg_catalog.pg_class t on t.oid = d.refobjid
  join pg_catalog.pg_attribute a on a.attrelid = t.oid and a.attnum = d.refobjsubid
  where s.relkind = 'S' and t.relnamespace = (select oid from ns) {{table_of_sequence}}
),
views as (
  select c.relname, pg_catalog.jsonb_build_object(
    'name', c.relname,
    'kind', case when c.relkind = 'm' then 'materialized view' else 'view' end,
    'columns', coalesce((
      select pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', a.attname, 'type', pg_catalog.format_type(a.atttypid, a.atttypmod)) order by a.attnum)
      from pg_catalog.pg_attribute a
      where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped), '[]'::jsonb),
    'definition', {{viewdef}}) as j
  from pg_catalog.pg_class c
  where c.relnamespace = (select oid from ns) and c.relkind in ('v', 'm') {{others}}
)
select pg_catalog.jsonb_build_object(
  'format', 'pgflow-catalog/1',
  'schema', $1::text,
  'tables', coalesce((select pg_catalog.jsonb_agg(j order by relname collate "C") from tables), '[]'::jsonb),
  'composite_types', coalesce((select pg_catalog.jsonb_agg(j order by typname collate "C") from ctypes), '[]'::jsonb),
  'enums', coalesce((select pg_catalog.jsonb_agg(j order by typname collate "C") from enums), '[]'::jsonb),
  'domains', coalesce((select pg_catalog.jsonb_agg(j order by typname collate "C") from domains), '[]'::jsonb),
  'functions', coalesce((select pg_catalog.jsonb_agg(j order by proname collate "C", ident collate "C") from functions), '[]'::jsonb),
  'triggers', coalesce((select pg_catalog.jsonb_agg(j order by relname collate "C", tgname collate "C") from triggers), '[]'::jsonb),
  'sequences', coalesce((select pg_catalog.jsonb_agg(j order by name collate "C") from sequences), '[]'::jsonb),
  'views', coalesce((select pg_catalog.jsonb_agg(j order by relname collate "C") from views), '[]'::jsonb),
  'pgmq', pg_catalog.jsonb_build_object(
    'extension_version', (select e.extversion from pg_catalog.pg_extension e where e.extname = 'pgmq')))
`
