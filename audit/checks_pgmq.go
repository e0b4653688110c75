package audit

import (
	"context"
	"fmt"
	"strings"
)

// pgmqFunctions are the pgmq functions pgflow and the upgrade call.
var pgmqFunctions = []string{
	"pgmq.list_queues()", "pgmq.create(text)", "pgmq.drop_queue(text)",
	"pgmq.send_batch(text, jsonb[], integer)",
	"pgmq.read(text, integer, integer, jsonb)",
	"pgmq.read_with_poll(text, integer, integer, integer, integer, jsonb)",
	"pgmq.archive(text, bigint)", "pgmq.archive(text, bigint[])",
	"pgmq.delete(text, bigint[])", "pgmq.set_vt(text, bigint, integer)",
	"pgmq.format_table_name(text, text)", // set_vt_batch and 0.17.0's pruning helper
}

func checkPGMQInstalled(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	p := env.PGMQ
	if p.Kind == "" {
		return []Finding{c.finding(1, "pgmq is not installed (no schema pgmq)", nil)}, nil
	}
	var missing []string
	// From pg_proc rather than to_regprocedure, which needs USAGE on the schema.
	if err := q.QueryRow(ctx, `select coalesce(pg_catalog.array_agg(f order by f), '{}')
		from pg_catalog.unnest($1::text[]) f
		where f not in (select 'pgmq.' || p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')'
		                from pg_catalog.pg_proc p
		                join pg_catalog.pg_namespace n on n.oid = p.pronamespace and n.nspname = 'pgmq')`, pgmqFunctions).Scan(&missing); err != nil {
		return nil, fmt.Errorf("looking up pgmq's functions: %w", err)
	}
	if len(missing) > 0 {
		var samples []map[string]any
		for _, m := range missing {
			if len(samples) < env.Sample {
				samples = append(samples, map[string]any{"function": m})
			}
		}
		return []Finding{c.finding(int64(len(missing)), "pgmq ("+p.String()+") lacks functions pgflow calls: "+strings.Join(missing, ", "), samples)}, nil
	}
	f := c.finding(0, "pgmq: "+p.String(), []map[string]any{{"kind": p.Kind, "version": p.Version}})
	f.Severity, f.Remedy = Info, "None."
	if p.Kind == "extension" && versionBelow(p.Version, 1, 5) {
		f.Severity, f.Message, f.Remedy = Warning, "pgmq extension "+p.Version+" is older than 1.5, the version pgflow 0.16.0 and the upgrade are written for",
			"ALTER EXTENSION pgmq UPDATE (to 1.5 or later) before the upgrade."
	}
	return []Finding{f}, nil
}

// versionBelow compares a "major.minor[.patch]" version with major.minor.
func versionBelow(v string, major, minor int) bool {
	var a, b int
	if n, _ := fmt.Sscanf(v, "%d.%d", &a, &b); n < 2 {
		return false // unparsable: say nothing rather than guess
	}
	return a < major || (a == major && b < minor)
}

func checkFlowQueueMissing(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	// pgmq names a queue's tables lower(name): a queue is there when any
	// listed spelling lowers to it. Up to 0.16.0 (and while an online upgrade
	// prepares) a flow's queue is lower(flow_slug) (0.16.0 created it as the
	// slug was given); on 0.17.0 the routes are the steps' stored queue_name,
	// plus lower(flow_slug) for a flow-mode flow (a step-mode flow has no
	// flow queue).
	var v17 bool
	if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_attribute a
		where a.attrelid = 'pgflow.flows'::pg_catalog.regclass and a.attname = 'queue_mode' and not a.attisdropped)`).Scan(&v17); err != nil {
		return nil, fmt.Errorf("looking for flows.queue_mode: %w", err)
	}
	routes := `select f.flow_slug, pg_catalog.lower(f.flow_slug) as queue from pgflow.flows f`
	if v17 {
		routes = `select f.flow_slug, pg_catalog.lower(f.flow_slug) as queue from pgflow.flows f where f.queue_mode = 'flow'
		  union
		  select s.flow_slug, s.queue_name from pgflow.steps s`
	}
	var n int64
	var samples []map[string]any
	err := scanTable(ctx, q, "flows", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with queues as materialized (select pg_catalog.lower(l.queue_name::text) as queue from pgmq.list_queues() l),
		routes as (`+routes+`),
		m as (
		  select r.flow_slug, r.queue from routes r
		  where not exists (select 1 from queues q where q.queue = r.queue)
		)
		select (select pg_catalog.count(*) from m),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('flow_slug', m.flow_slug, 'expected_queue', m.queue)
		         from m order by m.flow_slug, m.queue limit $1))`, env.Sample).Scan(&n, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("comparing flows with pgmq.list_queues(): %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	msg := fmt.Sprintf("%d flow queue(s) missing from pgmq", n)
	if v17 {
		msg += ": pgflow 0.17.0's delete_flow_and_data fails on these flows (42P01 on pgmq 1.5.1) until the queue exists again (docs/upstream-notes.md)"
	}
	return []Finding{c.finding(n, msg, samples)}, nil
}

// queuePhysicalSQL lists what is wrong with each flow queue's q_ and a_
// tables, from the system catalogs only.
const queuePhysicalSQL = `
with queues as materialized (
  select l.queue_name::text as queue_name, l.is_partitioned
  from pgmq.list_queues() l
  where exists (select 1 from pgflow.flows f where pg_catalog.lower(f.flow_slug) = pg_catalog.lower(l.queue_name::text))
),
expected (prefix, col, typ, required) as (values
  ('q', 'msg_id', 'bigint', true), ('q', 'read_ct', 'integer', true),
  ('q', 'enqueued_at', 'timestamp with time zone', true), ('q', 'vt', 'timestamp with time zone', true),
  ('q', 'message', 'jsonb', false), ('q', 'headers', 'jsonb', false),
  ('a', 'msg_id', 'bigint', true), ('a', 'read_ct', 'integer', true),
  ('a', 'enqueued_at', 'timestamp with time zone', true), ('a', 'archived_at', 'timestamp with time zone', true),
  ('a', 'vt', 'timestamp with time zone', true), ('a', 'message', 'jsonb', false), ('a', 'headers', 'jsonb', false)
),
tabs as (
  select q.queue_name, q.is_partitioned, p.prefix, p.prefix || '_' || pg_catalog.lower(q.queue_name) as relname,
         (select c.oid from pg_catalog.pg_class c
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
          where c.relname = p.prefix || '_' || pg_catalog.lower(q.queue_name) and c.relkind in ('r', 'p')) as relid
  from queues q cross join (values ('q'), ('a')) p (prefix)
),
problems as (
  select t.queue_name, t.relname, 'table is missing' as problem
  from tabs t where t.relid is null
  union all
  select t.queue_name, t.relname, 'column ' || e.col || ' is missing'
  from tabs t join expected e on e.prefix = t.prefix
  where t.relid is not null
    and not exists (select 1 from pg_catalog.pg_attribute a where a.attrelid = t.relid and a.attname = e.col and a.attnum > 0 and not a.attisdropped)
  union all
  select t.queue_name, t.relname,
         'column ' || e.col || ' is ' || pg_catalog.format_type(a.atttypid, a.atttypmod) || ', expected ' || e.typ
  from tabs t join expected e on e.prefix = t.prefix
  join pg_catalog.pg_attribute a on a.attrelid = t.relid and a.attname = e.col and a.attnum > 0 and not a.attisdropped
  where pg_catalog.format_type(a.atttypid, a.atttypmod) <> e.typ
  union all
  select t.queue_name, t.relname, 'column ' || e.col || ' is nullable, expected not null'
  from tabs t join expected e on e.prefix = t.prefix
  join pg_catalog.pg_attribute a on a.attrelid = t.relid and a.attname = e.col and a.attnum > 0 and not a.attisdropped
  where e.required and not a.attnotnull
  union all
  -- Partitioned queues (pg_partman) have no primary key or identity by design.
  select t.queue_name, t.relname, 'msg_id is not the primary key'
  from tabs t
  where t.relid is not null and not t.is_partitioned
    and not exists (
      select 1 from pg_catalog.pg_index i
      join pg_catalog.pg_attribute a on a.attrelid = t.relid and a.attname = 'msg_id' and not a.attisdropped
      where i.indrelid = t.relid and i.indisprimary and i.indnkeyatts = 1 and i.indkey[0] = a.attnum)
  union all
  select t.queue_name, t.relname, 'msg_id is not an identity column'
  from tabs t
  where t.prefix = 'q' and t.relid is not null and not t.is_partitioned
    and not exists (select 1 from pg_catalog.pg_attribute a
                    where a.attrelid = t.relid and a.attname = 'msg_id' and not a.attisdropped and a.attidentity in ('a', 'd'))
)
select pg_catalog.jsonb_build_object('queue', p.queue_name, 'table', 'pgmq.' || p.relname, 'problem', p.problem)
from problems p
order by p.queue_name, p.relname, p.problem`

func checkQueuePhysical(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	rows, err := q.Query(ctx, queuePhysicalSQL)
	if err != nil {
		return nil, fmt.Errorf("reading the flow queues' tables from pg_catalog: %w", err)
	}
	defer rows.Close()
	var samples []map[string]any
	queues := map[string]bool{}
	var problems int64
	for rows.Next() {
		var m map[string]any
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("reading the flow queues' tables from pg_catalog: %w", err)
		}
		problems++
		queues[fmt.Sprint(m["queue"])] = true
		if len(samples) < env.Sample {
			samples = append(samples, m)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the flow queues' tables from pg_catalog: %w", err)
	}
	if problems == 0 {
		return nil, nil
	}
	return []Finding{c.finding(int64(len(queues)),
		fmt.Sprintf("%d flow queue(s) with %d physical problem(s)", len(queues), problems), samples)}, nil
}

// backupSQL counts the listed queues, the unlogged ones, and those whose
// q_ or a_ table is a member of the pgmq extension (pg_depend 'e'), which
// pg_dump leaves out with their rows; and whether pgmq.meta is marked for
// pg_dump (pg_extension.extconfig, from pgmq 1.6.0).
const backupSQL = `
with l as materialized (select l.queue_name::text as queue_name, l.is_unlogged from pgmq.list_queues() l),
members as materialized (
  select l.queue_name from l
  where exists (select 1 from pg_catalog.pg_depend d
                join pg_catalog.pg_extension e on e.oid = d.refobjid and e.extname = 'pgmq'
                join pg_catalog.pg_class c on c.oid = d.objid
                join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
                where d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass and d.deptype = 'e'
                  and c.relname in ('q_' || pg_catalog.lower(l.queue_name), 'a_' || pg_catalog.lower(l.queue_name)))
)
select (select pg_catalog.count(*) from l),
       (select pg_catalog.count(*) from members),
       exists (select 1 from pg_catalog.pg_extension e
               where e.extname = 'pgmq' and pg_catalog.to_regclass('pgmq.meta') = any (e.extconfig)),
       (select pg_catalog.count(*) from l where l.is_unlogged),
       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', m.queue_name) from members m order by m.queue_name limit $1)),
       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', l.queue_name, 'unlogged', true) from l where l.is_unlogged order by l.queue_name limit $1))`

func checkBackup(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var queues, members, unlogged int64
	var metaDumped bool
	var samples, unloggedSamples []map[string]any
	if err := q.QueryRow(ctx, backupSQL, env.Sample).Scan(&queues, &members, &metaDumped, &unlogged, &samples, &unloggedSamples); err != nil {
		return nil, fmt.Errorf("listing queues with pgmq.list_queues() and their extension membership from pg_depend: %w", err)
	}
	var out []Finding
	// What pg_dump leaves out is read from the catalog, not assumed from
	// the version: below 1.6.0 every queue's tables are extension members;
	// from 1.6.0 only those the 1.6.0 update could not detach (it detaches
	// pgmq."q_<pgmq.meta name>", which misses a mixed-case name).
	if env.PGMQ.Kind == "extension" && queues > 0 && (members > 0 || !metaDumped) {
		var msg string
		if members > 0 {
			msg = fmt.Sprintf("pg_dump leaves out the tables and messages of %d of %d queue(s) (pgmq %s: their tables are members of the extension)", members, queues, env.PGMQ.Version)
			if !metaDumped {
				msg += ", and pgmq.meta"
			}
		} else {
			msg = fmt.Sprintf("pg_dump leaves out pgmq.meta, the list of all %d queue(s) (pgmq %s does not mark it for pg_dump)", queues, env.PGMQ.Version)
		}
		out = append(out, c.finding(members, msg, samples))
	}
	if unlogged > 0 {
		f := c.finding(unlogged, fmt.Sprintf("%d unlogged queue(s): their messages are lost on a crash and absent from physical backups and replicas", unlogged), unloggedSamples)
		f.Remedy = "Export their messages before apply, or recreate them as logged queues when they are empty."
		out = append(out, f)
	}
	return out, nil
}
