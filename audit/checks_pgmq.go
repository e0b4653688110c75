package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
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

// versionBelow compares a "major.minor[.patch]" version with major.minor.
func versionBelow(v string, major, minor int) bool {
	var a, b int
	if n, _ := fmt.Sscanf(v, "%d.%d", &a, &b); n < 2 {
		return false // unparsable: say nothing rather than guess
	}
	return a < major || (a == major && b < minor)
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

// pgmqInstalled is pgmq.installed.
var pgmqInstalled = Check{
	ID: "pgmq.installed", Title: "pgmq installed, version and functions", Severity: Blocker, Runs: InAudit | UnderLocks,
	Meaning: "pgflow keeps every task's message in pgmq and calls pgmq's public functions. " +
		"Reports which pgmq is installed (extension and version, or a plain schema); a missing pgmq or missing functions block.",
	Remedy: "Install pgmq 1.5 or later (CREATE EXTENSION pgmq) in schema pgmq before upgrading pgflow.",
	Run:    checkPGMQInstalled,
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

// pgmqUnownedQueue is pgmq.unowned_queue.
var pgmqUnownedQueue = Check{
	ID: "pgmq.unowned_queue", Title: "listed queues no flow owns", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow | NeedsPGMQ,
	Meaning: "A queue in pgmq.list_queues() whose lower-case name is no flow's lower(flow_slug). The migration leaves queues alone, but after it " +
		"create_flow refuses a new flow whose queue name is already listed (unique_violation) and a step-mode flow refuses a listed queue it does not own.",
	Remedy: "If the queue is a leftover of a deleted flow, drop it once its messages are not needed (select pgmq.drop_queue('<queue>')); " +
		"if it is your application's, keep it and never name a flow (or flow__step) after it.",
	Run: checkUnownedQueue,
}

func checkUnownedQueue(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var named, other int64
	var namedSamples, otherSamples []map[string]any
	err := scanTable(ctx, q, "flows", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with l as materialized (select l.queue_name::text as queue_name from pgmq.list_queues() l),
		owned as (`+ownedQueuesSQL(env)+`),
		u as (
		  select l.queue_name, pg_catalog.lower(l.queue_name) ~ '^[a-z]' as flow_like
		  from l where pg_catalog.lower(l.queue_name) not in (select o.queue from owned o where o.queue is not null)
		)
		select (select pg_catalog.count(*) from u where u.flow_like),
		       (select pg_catalog.count(*) from u where not u.flow_like),
		       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', u.queue_name)
		                                 from u where u.flow_like order by u.queue_name limit $1)),
		       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', u.queue_name)
		                                 from u where not u.flow_like order by u.queue_name limit $1))`, env.Sample).
			Scan(&named, &other, &namedSamples, &otherSamples)
	})
	if err != nil {
		return nil, fmt.Errorf("comparing pgmq.list_queues() with the flows: %w", err)
	}
	var out []Finding
	if named > 0 {
		out = append(out, c.finding(named, fmt.Sprintf("%d listed pgmq queue(s) that no flow owns, named like a flow: after the upgrade "+
			"create_flow refuses a new flow of that name and a step-mode flow refuses such a queue as its route", named), namedSamples))
	}
	if other > 0 {
		f := c.finding(other, fmt.Sprintf("%d listed pgmq queue(s) that no flow owns and no flow can be named after (not starting with a letter): "+
			"not pgflow's, the upgrade leaves them alone", other), otherSamples)
		f.Severity, f.Remedy = Info, "None: pgflow never uses a queue whose name does not start with a letter."
		out = append(out, f)
	}
	return out, nil
}

// pgmqQueueCaseSpellings is pgmq.queue_case_spellings.
var pgmqQueueCaseSpellings = Check{
	ID: "pgmq.queue_case_spellings", Title: "queues listed under more than one case spelling", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow | NeedsPGMQ,
	Meaning: "pgmq names a queue's tables in lower case, so MyFlow and myflow listed together are one set of tables with two pgmq.meta rows. " +
		"The migration does not mind, but after it delete_flow_and_data raises ambiguous_alias for such a flow and step-mode routes refuse such a name.",
	Remedy: "Do not drop either spelling with pgmq.drop_queue: both name the same tables and their messages. Keep the spelling lower(flow_slug): " +
		"remove the other spelling's pgmq.meta row (delete from pgmq.meta where queue_name = '<spelling>') in a maintenance window, then audit again.",
	Run: checkQueueCaseSpellings,
}

func checkQueueCaseSpellings(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var n int64
	var samples []map[string]any
	err := scanTable(ctx, q, "flows", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with l as materialized (select l.queue_name::text as queue_name from pgmq.list_queues() l),
		g as (
		  select pg_catalog.lower(l.queue_name) as lowered, pg_catalog.array_agg(l.queue_name order by l.queue_name) as spellings
		  from l group by pg_catalog.lower(l.queue_name) having pg_catalog.count(*) > 1
		)
		select (select pg_catalog.count(*) from g),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('queue_table', 'pgmq.q_' || g.lowered,
		                  'spellings', pg_catalog.array_to_string(g.spellings, ', '),
		                  'flow_slugs', (select pg_catalog.array_to_string(pg_catalog.array_agg(f.flow_slug order by f.flow_slug), ', ')
		                                 from pgflow.flows f where pg_catalog.lower(f.flow_slug) = g.lowered))
		         from g order by g.lowered limit $1))`, env.Sample).Scan(&n, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("grouping pgmq.list_queues() case-insensitively: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d queue(s) listed under more than one case spelling (one set of tables each): "+
		"after the upgrade delete_flow_and_data and step-queue checks raise on such an ambiguous queue", n), samples)}, nil
}

// pgmqFlowQueueMissing is pgmq.flow_queue_missing.
var pgmqFlowQueueMissing = Check{
	ID: "pgmq.flow_queue_missing", Title: "every flow has its queue", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow | NeedsPGMQ,
	Meaning: "A flow's queue is lower(flow_slug) in any listed spelling (on 0.17.0: each step's stored queue_name, plus lower(flow_slug) in flow mode). " +
		"A flow without one has nowhere to put its tasks' messages: start_flow fails before and after the upgrade. The migration itself does not need it. " +
		"On 0.17.0 pgflow's delete_flow_and_data also fails for such a flow (pgmq 1.5.1's drop_queue raises 42P01) and changes nothing.",
	Remedy: "Create the missing queue (select pgmq.create('<queue>')); to remove the flow instead, create it first all the same, then " +
		"select pgflow.delete_flow_and_data('<slug>'); audit again.",
	Run: checkFlowQueueMissing,
}

func checkFlowQueueMissing(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	// Up to 0.16.0 (and while an online upgrade prepares) a flow's queue is
	// lower(flow_slug) (0.16.0 created it as the slug was given); on 0.17.0
	// the routes are the steps' stored queue_name, plus lower(flow_slug) for
	// a flow-mode flow (a step-mode flow has no flow queue).
	v17, err := hasQueueMode(ctx, q)
	if err != nil {
		return nil, err
	}
	routes := `select f.flow_slug, pg_catalog.lower(f.flow_slug) as queue from pgflow.flows f`
	if v17 {
		routes = `select f.flow_slug, pg_catalog.lower(f.flow_slug) as queue from pgflow.flows f where f.queue_mode = 'flow'
		  union
		  select s.flow_slug, s.queue_name from pgflow.steps s`
	}
	n, samples, err := missingQueues(ctx, q, routes, env.Sample)
	if err != nil || n == 0 {
		return nil, err
	}
	msg := fmt.Sprintf("%d flow queue(s) missing from pgmq", n)
	if v17 {
		msg += ": pgflow 0.17.0's delete_flow_and_data fails on these flows (42P01 on pgmq 1.5.1) until the queue exists again (docs/upstream-notes.md)"
	}
	return []Finding{c.finding(n, msg, samples)}, nil
}

// hasQueueMode says whether pgflow.flows has queue_mode (0.17.0 and later).
func hasQueueMode(ctx context.Context, q Querier) (bool, error) {
	var v17 bool
	if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_attribute a
		where a.attrelid = 'pgflow.flows'::pg_catalog.regclass and a.attname = 'queue_mode' and not a.attisdropped)`).Scan(&v17); err != nil {
		return false, fmt.Errorf("looking for flows.queue_mode: %w", err)
	}
	return v17, nil
}

// missingQueues counts the routes (a query of flow_slug, queue) whose queue
// is missing from pgmq, with up to sample of them. pgmq names a queue's
// tables lower(name): a queue is there when any listed spelling lowers to it.
func missingQueues(ctx context.Context, q Querier, routes string, sample int) (int64, []map[string]any, error) {
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
		         from m order by m.flow_slug, m.queue limit $1))`, sample).Scan(&n, &samples)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("comparing flows with pgmq.list_queues(): %w", err)
	}
	return n, samples, nil
}

// pgmqQueuePhysical is pgmq.queue_physical.
var pgmqQueuePhysical = Check{
	ID: "pgmq.queue_physical", Title: "flow queues have the tables pgflow needs", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow | NeedsPGMQ,
	Meaning: "Each flow queue needs pgmq.q_<queue> and pgmq.a_<queue> with pgmq 1.5's columns and types, msg_id as primary key, " +
		"and msg_id an identity column on q_ (read from pg_class, pg_attribute and pg_index). A queue without them breaks sends, reads and archives " +
		"before and after the upgrade.",
	Remedy: "Recreate the damaged queue through pgmq once its messages are safe (export them, select pgmq.drop_queue('<queue>'), select pgmq.create('<queue>'), re-send), " +
		"or restore the table from backup; never ALTER pgmq's tables by hand.",
	Run: checkQueuePhysical,
}

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

// The checks for what makes the 0.16.0 → 0.17.0 migration fail (its unique
// indexes, CHECKs and re-added slug constraints) or what changes under it
// (queues, workers). Each counts exactly over small tables (flows, steps,
// workers, pgmq.list_queues()); the one big table is in duplicates.go.

// slugRuleSQL lists the flow and step slugs that 0.17.0's is_valid_slug
// rejects, with every reason. The 0.16.0 rule (re-checked too, in case a
// constraint was bypassed): not empty, at most 128 characters, letters,
// digits and underscores not starting with a digit, not "run". 0.17.0 adds:
// the first character is a letter, the last a letter or digit, no "__".
const slugRuleSQL = `
with s as (
  select 'flow'::text as kind, f.flow_slug, null::text as step_slug, f.flow_slug as slug from pgflow.flows f
  union all
  select 'step', st.flow_slug, st.step_slug, st.step_slug from pgflow.steps st
),
bad as (
  select s.*, pg_catalog.array_remove(array[
           case when s.slug = '' then 'empty' end,
           case when pg_catalog.length(s.slug) > 128 then 'longer than 128 characters' end,
           case when s.slug !~ '^[a-zA-Z_][a-zA-Z0-9_]*$' then 'not only letters, digits and _' end,
           case when s.slug = 'run' then 'the reserved slug run' end,
           case when s.slug !~ '^[a-zA-Z]' then 'first character is not a letter' end,
           case when s.slug !~ '[a-zA-Z0-9]$' then 'last character is not a letter or digit' end,
           case when pg_catalog.strpos(s.slug, '__') > 0 then 'contains __' end
         ], null) as reasons
  from s
),
b as (select * from bad where pg_catalog.cardinality(bad.reasons) > 0)
select (select pg_catalog.count(*) from b where b.kind = 'flow'),
       (select pg_catalog.count(*) from b where b.kind = 'step'),
       pg_catalog.to_jsonb(array(
         select pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object('kind', b.kind, 'flow_slug', b.flow_slug,
                  'step_slug', b.step_slug, 'reasons', b.reasons))
         from b order by b.kind, b.flow_slug, b.step_slug nulls first limit $1))`

// Only steps and tasks get a queue_name column, so upstream's migration
// applies over a long-slug flow that has neither: such a flow is a warning
// (it can never get steps under 0.17.0), one with steps or tasks a blocker.
// step_tasks is read only when a long-slug flow has no steps (rare, and by
// flow_slug through idx_step_tasks_flow_run_step), so a lock on step_tasks
// leaves this check alone otherwise.
const queueNameLengthSQL = `
select f.flow_slug, pg_catalog.length(pg_catalog.lower(f.flow_slug)),
       exists (select 1 from pgflow.steps s where s.flow_slug = f.flow_slug)
from pgflow.flows f
where pg_catalog.length(pg_catalog.lower(f.flow_slug)) > $1
order by f.flow_slug`

// stepless long-slug flows: what to do about them.
const queueNameStepless = "Such a flow cannot get steps under 0.17.0 (its queue name is too long for them): " +
	"delete it (select pgflow.delete_flow_and_data('<slug>')) or compile it again under a slug of at most 47 characters."

type longFlow struct {
	slug         string
	length       int64
	steps, tasks bool
}

// ownedQueuesSQL: the lower-case queue names pgflow owns. Every flow owns
// lower(flow_slug); after the upgrade, steps.queue_name also names
// step-mode queues.
func ownedQueuesSQL(env Env) string {
	owned := `select pg_catalog.lower(f.flow_slug) as queue from pgflow.flows f`
	if env.Schema.State == versions.SchemaUpgraded {
		owned += ` union select s.queue_name from pgflow.steps s`
	}
	return owned
}
