package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The catalog, in output order. IDs are stable: scripts and apply's output
// refer to them.
func init() {
	catalog = []Check{
		{
			ID: "schema.state", Title: "pgflow schema state", Severity: Blocker, Preflight: true,
			Meaning: "The live catalog is compared with the pgflow 0.16.0 baseline and the upgraded shape. " +
				"Baseline and upgraded are reported as info; a partial, unknown or missing pgflow schema is a blocker, with the differences named.",
			Remedy: "A partial state is not something apply can start from: compare the differences with the 0.16.0 release and the migration, " +
				"restore the missing objects (or restore from backup), then audit again. No pgflow schema: point --dsn at the right database.",
			Run: checkSchemaState,
		},
		{
			ID: "pgmq.installed", Title: "pgmq installed, version and functions", Severity: Blocker, Preflight: true,
			Meaning: "pgflow keeps every task's message in pgmq; the upgrade and the new claim path call pgmq's public functions only. " +
				"Reports which pgmq is installed (extension and version, or a plain schema); a missing pgmq or missing functions block.",
			Remedy: "Install pgmq 1.5 or later (CREATE EXTENSION pgmq) in schema pgmq before upgrading pgflow.",
			Run:    checkPGMQInstalled,
		},
		{
			ID: "pgmq.flow_queue_missing", Title: "every flow has its queue", Severity: Blocker, Preflight: true,
			Needs:   NeedsPgflow | NeedsPGMQ,
			Meaning: "A flow's queue is named exactly as its slug. A flow without a queue in pgmq.list_queues() has nowhere to put its tasks' messages; the upgrade refuses it.",
			Remedy:  "Create the missing queue (select pgmq.create('<slug>')) or delete the flow (select pgflow.delete_flow_and_data('<slug>')), then audit again.",
			Run:     checkFlowQueueMissing,
		},
		{
			ID: "pgmq.queue_physical", Title: "flow queues have the tables pgflow needs", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "Each flow queue needs pgmq.q_<queue> and pgmq.a_<queue> with pgmq 1.5's columns and types, msg_id as primary key, " +
				"and msg_id an identity column on q_ (read from pg_class, pg_attribute and pg_index). A queue without them breaks reads, archives or the backfill.",
			Remedy: "Recreate the damaged queue through pgmq once its messages are safe (export them, select pgmq.drop_queue('<queue>'), select pgmq.create('<queue>'), re-send), " +
				"or restore the table from backup; never ALTER pgmq's tables by hand.",
			Run: checkQueuePhysical,
		},
		{
			ID: "flows.case_alias", Title: "case-only slug aliases", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "pgmq lowercases table names, so flows whose slugs differ only in case (MyFlow, myflow) share one physical queue and read each other's messages. " +
				"The upgrade makes slugs unique case-insensitively and refuses while aliases exist.",
			Remedy: "Keep one slug of each group: drain and delete the others (select pgflow.delete_flow_and_data('<slug>') after their runs finish), then audit again.",
			Run:    checkCaseAlias,
		},
		{
			ID: "tasks.duplicate_message_id", Title: "tasks sharing one message id", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "Two tasks of one flow with the same message_id (e.g. after a queue was dropped and recreated, restarting its ids) cannot both own that message; " +
				"the upgrade adds unique (queue_name, message_id) and refuses. Bounded: looks at the lowest message ids.",
			Remedy: "Decide which task owns the message; set message_id = null on finished tasks that no longer need it (or delete their old runs), then audit again.",
			Run:    checkDuplicateMessageID,
		},
		{
			ID: "tasks.message_missing", Title: "active tasks whose message is missing", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "A queued or started task of a started step and run whose message is not in its flow's queue: no worker will ever claim it, so its run is stuck. " +
				"The upgrade keeps it as it is. Bounded: looks at most --bound active tasks.",
			Remedy: "Fail the task (select pgflow.fail_task(run_id, step_slug, task_index, 'message lost')) or fail its run, and start the run again if needed.",
			Run:    checkMessageMissing,
		},
		{
			ID: "queue.orphan_message", Title: "queue messages with no task", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "A message in a flow's queue that no task of that flow points at (a foreign message, or one left behind). The new claim path reports it as fatal and claims nothing in its batch; " +
				"the upgrade refuses. Bounded: looks at the oldest messages of each queue.",
			Remedy: "Inspect the samples; archive what is not pgflow work (select pgmq.archive('<queue>', <message_id>)), then audit again.",
			Run:    checkOrphanMessage,
		},
		{
			ID: "queue.envelope_contradiction", Title: "messages whose body names other work", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "A message whose body (flow_slug, run_id, step_slug, task_index) contradicts the task that owns its address. Absent fields do not contradict; present, different ones do. " +
				"The new claim path treats it as fatal; the upgrade refuses. Bounded: looks at the oldest messages of each queue.",
			Remedy: "Find out how the message was written; fail the owning task (select pgflow.fail_task(...)) and archive the message (select pgmq.archive('<queue>', <message_id>)), then audit again.",
			Run:    checkEnvelopeContradiction,
		},
		{
			ID: "workers.legacy_alive", Title: "0.16.0 workers still alive", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "Workers with a heartbeat in the last minute, not stopped or deprecated, on a 0.16.0 schema. The upgrade fences them: " +
				"a running one fails loudly at its next claim (its messages become visible again, nothing is lost), a restarted one fails before it registers.",
			Remedy: "Stop (or scale to zero) the 0.16.0 workers right before apply, and start workers on the new protocol right after it commits.",
			Run:    checkLegacyWorkers,
		},
		{
			ID: "sessions.long_transactions", Title: "long and idle-in-transaction sessions", Severity: Warning,
			Meaning: "Transactions open for more than 30 s, or idle in transaction for more than 10 s, in this database: apply's table locks wait behind their locks " +
				"and apply gives up after its lock timeout. Without pg_read_all_stats (or pg_monitor) other roles' sessions are invisible; that is reported as info.",
			Remedy: "Finish or terminate them (select pg_terminate_backend(pid)) before apply; find the client by application_name.",
			Run:    checkLongTransactions,
		},
		{
			ID: "sessions.locks_on_pgflow", Title: "locks held on pgflow tables", Severity: Warning,
			Meaning: "Locks other sessions hold or wait for on pgflow tables: strong modes (above ROW EXCLUSIVE), waits, or any lock of a transaction older than 5 s. " +
				"apply needs ACCESS EXCLUSIVE on flows and step_tasks and would wait behind them (up to its lock timeout per try).",
			Remedy: "Let the holders finish, or stop them (select pg_terminate_backend(pid)), before apply.",
			Run:    checkLocksOnPgflow,
		},
		{
			ID: "size.tables", Title: "table sizes and backfill estimate", Severity: Info,
			Needs: NeedsPgflow,
			Meaning: "Rows (pg_class.reltuples, as of the last ANALYZE; -1: never analyzed) and bytes (pg_total_relation_size) of the pgflow tables and queue tables. " +
				"The upgrade rewrites pgflow.step_tasks with its indexes under ACCESS EXCLUSIVE: that is the backfill work and the lock window.",
			Remedy: "Plan the window from the step_tasks size (measure with apply --dry-run on a restored copy); prune old runs first to shrink it.",
			Run:    checkSizes,
		},
		{
			ID: "backup.pgdump_pgmq", Title: "backups include the queues", Severity: Warning, Preflight: true,
			Needs: NeedsPGMQ,
			Meaning: "pgmq installed as an extension registers its queue tables as extension members without pg_extension_config_dump, so pg_dump leaves pgmq.meta, " +
				"every q_/a_ table and all their rows out. Unlogged queues are also missing from physical backups and replicas.",
			Remedy: "Before apply take a physical backup or provider snapshot (pg_basebackup, PITR), or export the queue tables next to pg_dump " +
				"(\\copy (select * from pgmq.q_<queue>) to ...), and check that a restore brings the messages back.",
			Run: checkBackup,
		},
	}
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

func check(id string) Check {
	for _, c := range catalog {
		if c.ID == id {
			return c
		}
	}
	panic("audit: no check " + id)
}

// sampleRows scans rows of (jsonb sample) into at most env.Sample maps.
func sampleRows(rows pgx.Rows, env Env) ([]map[string]any, int64, error) {
	defer rows.Close()
	var out []map[string]any
	var n int64
	for rows.Next() {
		var m map[string]any
		if err := rows.Scan(&m); err != nil {
			return nil, 0, err
		}
		n++
		if len(out) < env.Sample {
			out = append(out, m)
		}
	}
	return out, n, rows.Err()
}

// queueGroup is one physical queue table shared by the flows in Slugs
// (more than one slug: case-only aliases).
type queueGroup struct {
	Queue string   // the first slug: the queue name used in remedies
	Table string   // q_<lower(slug)>
	Slugs []string // flows whose queue is this table
}

// flowQueueTables lists the flows' physical queue tables that exist with
// the columns the message checks read (msg_id, message); damaged ones are
// pgmq.queue_physical's business.
func flowQueueTables(ctx context.Context, q Querier) ([]queueGroup, error) {
	rows, err := q.Query(ctx, `
		select 'q_' || pg_catalog.lower(f.flow_slug), pg_catalog.array_agg(f.flow_slug order by f.flow_slug)
		from pgflow.flows f
		where exists (
		  select 1
		  from pg_catalog.pg_class c
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
		  where c.relname = 'q_' || pg_catalog.lower(f.flow_slug) and c.relkind in ('r', 'p')
		    and exists (select 1 from pg_catalog.pg_attribute a where a.attrelid = c.oid and a.attname = 'msg_id' and not a.attisdropped)
		    and exists (select 1 from pg_catalog.pg_attribute a where a.attrelid = c.oid and a.attname = 'message' and not a.attisdropped))
		group by 1
		order by 1`)
	if err != nil {
		return nil, fmt.Errorf("listing the flows' queue tables: %w", err)
	}
	defer rows.Close()
	var out []queueGroup
	for rows.Next() {
		var g queueGroup
		if err := rows.Scan(&g.Table, &g.Slugs); err != nil {
			return nil, fmt.Errorf("listing the flows' queue tables: %w", err)
		}
		g.Queue = g.Slugs[0]
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing the flows' queue tables: %w", err)
	}
	return out, nil
}

// perQueue runs one bounded query per queue table, sharing env.Bound between
// them, and adds up (looked, matched, samples). query gets $1 slugs, $2
// limit (null: none), $3 sample size, $4 queue name, and returns one row
// (looked bigint, matched bigint, samples jsonb).
func perQueue(ctx context.Context, q Querier, env Env, what string, query func(table string) string) (looked, matched int64, atLeast bool, samples []map[string]any, err error) {
	groups, err := flowQueueTables(ctx, q)
	if err != nil {
		return 0, 0, false, nil, err
	}
	for _, g := range groups {
		left := env.Bound - looked
		if env.bounded() && left <= 0 {
			return looked, matched, true, samples, nil
		}
		if err := tighten(ctx, q, env); err != nil {
			return 0, 0, false, nil, err
		}
		var l, m int64
		var s []map[string]any
		if err := q.QueryRow(ctx, query(pgx.Identifier{"pgmq", g.Table}.Sanitize()), g.Slugs, env.limit(left), env.Sample, g.Queue).
			Scan(&l, &m, &s); err != nil {
			return 0, 0, false, nil, fmt.Errorf("%s in queue %s: %w", what, g.Queue, err)
		}
		looked += l
		matched += m
		if env.bounded() && l >= left {
			atLeast = true
		}
		for _, row := range s {
			if len(samples) < env.Sample {
				samples = append(samples, row)
			}
		}
	}
	return looked, matched, atLeast, samples, nil
}

// ---------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------

func checkSchemaState(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("schema.state")
	s := env.Schema
	var samples []map[string]any
	for _, d := range s.Differences {
		if len(samples) < env.Sample {
			samples = append(samples, map[string]any{"difference": d})
		}
	}
	f := c.finding(int64(len(s.Differences)), false, "schema state "+string(s.State)+": "+s.describe(), samples)
	switch s.State {
	case StateBaseline:
		f.Severity, f.Remedy, f.Count = Info, "None: this is the shape apply starts from.", 0
	case StateUpgraded:
		f.Severity, f.Remedy, f.Count = Info, "None: apply will report that there is nothing to do.", 0
	case StatePartial:
		// Between the two shapes by design while an online upgrade of ours
		// runs (its progress table exists only then): a state with a next
		// command, as `status` says, not a damaged schema. The preflight
		// keeps it a blocker (apply starts from the baseline only).
		var online bool
		if env.Mode == ModeAudit {
			if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.online_progress') is not null`).Scan(&online); err != nil {
				return nil, err
			}
		}
		if online {
			f.Severity = Warning
			f.Message = "an online upgrade (apply --online) is in progress: the schema is between 0.16.0 and the upgraded shape until it ends: " + s.describe()
			f.Remedy = "Continue it with pgflow-upgrade apply --online, or undo it with pgflow-upgrade apply --rollback-online; pgflow-upgrade status shows its phase and progress."
		}
	}
	return []Finding{f}, nil
}

// pgmqFunctions are the pgmq functions pgflow and the upgrade call.
var pgmqFunctions = []string{
	"pgmq.list_queues()", "pgmq.create(text)", "pgmq.drop_queue(text)",
	"pgmq.send_batch(text, jsonb[], integer)",
	"pgmq.read(text, integer, integer, jsonb)",
	"pgmq.read_with_poll(text, integer, integer, integer, integer, jsonb)",
	"pgmq.archive(text, bigint)", "pgmq.archive(text, bigint[])",
	"pgmq.delete(text, bigint[])", "pgmq.set_vt(text, bigint, integer)",
}

func checkPGMQInstalled(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("pgmq.installed")
	p := env.PGMQ
	if p.Kind == "" {
		return []Finding{c.finding(1, false, "pgmq is not installed (no schema pgmq)", nil)}, nil
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
		return []Finding{c.finding(int64(len(missing)), false, "pgmq ("+p.String()+") lacks functions pgflow calls: "+strings.Join(missing, ", "), samples)}, nil
	}
	f := c.finding(0, false, "pgmq: "+p.String(), []map[string]any{{"kind": p.Kind, "version": p.Version}})
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

func checkFlowQueueMissing(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("pgmq.flow_queue_missing")
	rows, err := q.Query(ctx, `
		with queues as materialized (select l.queue_name::text as queue_name from pgmq.list_queues() l)
		select pg_catalog.jsonb_build_object('flow_slug', f.flow_slug, 'expected_queue', f.flow_slug)
		from (select flow_slug from pgflow.flows limit $1) f
		where not exists (select 1 from queues q where q.queue_name = f.flow_slug)
		order by f.flow_slug`, env.limit(env.Bound))
	if err != nil {
		return nil, fmt.Errorf("comparing flows with pgmq.list_queues(): %w", err)
	}
	samples, n, err := sampleRows(rows, env)
	if err != nil {
		return nil, fmt.Errorf("comparing flows with pgmq.list_queues(): %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, false, fmt.Sprintf("%d flow(s) without their pgmq queue", n), samples)}, nil
}

// queuePhysicalSQL lists what is wrong with each flow queue's q_ and a_
// tables, from the system catalogs only.
const queuePhysicalSQL = `
with queues as materialized (
  select l.queue_name::text as queue_name, l.is_partitioned
  from pgmq.list_queues() l
  where exists (select 1 from pgflow.flows f where f.flow_slug = l.queue_name::text)
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

func checkQueuePhysical(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("pgmq.queue_physical")
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
	return []Finding{c.finding(int64(len(queues)), false,
		fmt.Sprintf("%d flow queue(s) with %d physical problem(s)", len(queues), problems), samples)}, nil
}

func checkCaseAlias(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("flows.case_alias")
	rows, err := q.Query(ctx, `
		select pg_catalog.jsonb_build_object('queue_table', 'pgmq.q_' || pg_catalog.lower(f.flow_slug),
		         'flow_slugs', pg_catalog.string_agg(f.flow_slug, ', ' order by f.flow_slug))
		from (select flow_slug from pgflow.flows limit $1) f
		group by pg_catalog.lower(f.flow_slug)
		having pg_catalog.count(*) > 1
		order by pg_catalog.lower(f.flow_slug)`, env.limit(env.Bound))
	if err != nil {
		return nil, fmt.Errorf("grouping flow slugs case-insensitively: %w", err)
	}
	samples, n, err := sampleRows(rows, env)
	if err != nil {
		return nil, fmt.Errorf("grouping flow slugs case-insensitively: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, false, fmt.Sprintf("%d group(s) of flow slugs that differ only in case share one physical queue", n), samples)}, nil
}

func checkDuplicateMessageID(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("tasks.duplicate_message_id")
	// Bounded: the lowest message ids in idx_step_tasks_message_id order.
	var looked, groups int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with d as materialized (
		  select t.flow_slug, t.message_id
		  from pgflow.step_tasks t
		  where t.message_id is not null
		  order by t.message_id
		  limit $1
		),
		g as (
		  select d.flow_slug, d.message_id, pg_catalog.count(*) as tasks
		  from d group by d.flow_slug, d.message_id having pg_catalog.count(*) > 1
		)
		select (select pg_catalog.count(*) from d), (select pg_catalog.count(*) from g),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('flow_slug', g.flow_slug, 'message_id', g.message_id::text, 'tasks', g.tasks)
		         from g order by g.flow_slug, g.message_id limit $2))`,
		env.limit(env.Bound), env.Sample).Scan(&looked, &groups, &samples)
	if err != nil {
		return nil, fmt.Errorf("looking for tasks that share a message id: %w", err)
	}
	if groups == 0 {
		return nil, nil
	}
	atLeast := env.bounded() && looked >= env.Bound
	return []Finding{c.finding(groups, atLeast, fmt.Sprintf("%s message id(s) owned by more than one task of the same flow", countText(groups, atLeast)), samples)}, nil
}

func checkMessageMissing(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("tasks.message_missing")
	looked, n, atLeast, samples, err := perQueue(ctx, q, env, "looking for active tasks whose message is missing", func(table string) string {
		return `
		with t as materialized (
		  select t.flow_slug, t.run_id, t.step_slug, t.task_index, t.message_id, t.status
		  from pgflow.step_tasks t
		  join pgflow.runs r on r.run_id = t.run_id and r.status = 'started'
		  join pgflow.step_states s on s.run_id = t.run_id and s.step_slug = t.step_slug and s.status = 'started'
		  where t.flow_slug = any($1::text[]) and t.status in ('queued', 'started')
		    and t.message_id is not null and t.permanently_stalled_at is null
		  limit $2
		),
		m as (
		  select t.* from t where not exists (select 1 from ` + table + ` q where q.msg_id = t.message_id)
		)
		select (select pg_catalog.count(*) from t), (select pg_catalog.count(*) from m),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('queue', $4::text, 'flow_slug', m.flow_slug, 'run_id', m.run_id,
		                  'step_slug', m.step_slug, 'task_index', m.task_index, 'message_id', m.message_id::text, 'status', m.status)
		         from m order by m.message_id limit $3))`
	})
	if err != nil {
		return nil, err
	}
	_ = looked
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, atLeast, fmt.Sprintf("%s active task(s) whose message is not in their queue", countText(n, atLeast)), samples)}, nil
}

func checkOrphanMessage(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("queue.orphan_message")
	_, n, atLeast, samples, err := perQueue(ctx, q, env, "looking for messages with no task", func(table string) string {
		return `
		with m as materialized (
		  select q.msg_id, q.read_ct, q.enqueued_at, q.message from ` + table + ` q order by q.msg_id limit $2
		),
		o as (
		  select m.* from m
		  where not exists (select 1 from pgflow.step_tasks t where t.message_id = m.msg_id and t.flow_slug = any($1::text[]))
		)
		select (select pg_catalog.count(*) from m), (select pg_catalog.count(*) from o),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('queue', $4::text, 'message_id', o.msg_id::text, 'read_ct', o.read_ct,
		                  'enqueued_at', o.enqueued_at, 'body', pg_catalog.left(o.message::text, 200))
		         from o order by o.msg_id limit $3))`
	})
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, atLeast, fmt.Sprintf("%s queue message(s) that no task points at", countText(n, atLeast)), samples)}, nil
}

func checkEnvelopeContradiction(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("queue.envelope_contradiction")
	_, n, atLeast, samples, err := perQueue(ctx, q, env, "comparing message bodies with their tasks", func(table string) string {
		return `
		with m as materialized (
		  select q.msg_id, q.message from ` + table + ` q order by q.msg_id limit $2
		),
		x as (
		  select m.msg_id, m.message, t.flow_slug, t.run_id, t.step_slug, t.task_index,
		         pg_catalog.array_remove(array[
		           case when m.message -> 'flow_slug' is not null and m.message ->> 'flow_slug' is distinct from t.flow_slug then 'flow_slug' end,
		           case when m.message -> 'run_id' is not null and pg_catalog.lower(m.message ->> 'run_id') is distinct from t.run_id::text then 'run_id' end,
		           case when m.message -> 'step_slug' is not null and m.message ->> 'step_slug' is distinct from t.step_slug then 'step_slug' end,
		           case when m.message -> 'task_index' is not null and m.message -> 'task_index' is distinct from pg_catalog.to_jsonb(t.task_index) then 'task_index' end
		         ], null) as differs
		  from m join pgflow.step_tasks t on t.message_id = m.msg_id and t.flow_slug = any($1::text[])
		),
		b as (select x.* from x where pg_catalog.cardinality(x.differs) > 0)
		select (select pg_catalog.count(*) from m), (select pg_catalog.count(distinct b.msg_id) from b),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('queue', $4::text, 'message_id', b.msg_id::text,
		                  'task', pg_catalog.jsonb_build_object('flow_slug', b.flow_slug, 'run_id', b.run_id, 'step_slug', b.step_slug, 'task_index', b.task_index),
		                  'differs', b.differs, 'body', pg_catalog.left(b.message::text, 200))
		         from b order by b.msg_id limit $3))`
	})
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, atLeast, fmt.Sprintf("%s message(s) whose body contradicts the task that owns them", countText(n, atLeast)), samples)}, nil
}

func checkLegacyWorkers(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("workers.legacy_alive")
	if env.Schema.State == StateUpgraded {
		return nil, nil // live workers of an upgraded schema speak the new protocol
	}
	var n int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with w as materialized (
		  select w.worker_id, w.queue_name, w.function_name, w.started_at, w.last_heartbeat_at
		  from pgflow.workers w
		  where w.stopped_at is null and w.deprecated_at is null
		    and w.last_heartbeat_at > pg_catalog.now() - interval '1 minute'
		  limit $1
		)
		select (select pg_catalog.count(*) from w),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('worker_id', w.worker_id, 'queue', w.queue_name, 'function_name', w.function_name,
		                  'started_at', w.started_at, 'heartbeat_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - w.last_heartbeat_at)))
		         from w order by w.last_heartbeat_at desc limit $2))`, env.limit(env.Bound), env.Sample).Scan(&n, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading live workers from pgflow.workers: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	atLeast := env.bounded() && n >= env.Bound
	return []Finding{c.finding(n, atLeast, fmt.Sprintf("%s 0.16.0 worker(s) with a heartbeat in the last minute", countText(n, atLeast)), samples)}, nil
}

func checkLongTransactions(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("sessions.long_transactions")
	var n, hidden int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with a as materialized (
		  select a.pid, a.usename, a.application_name, a.state, a.xact_start, a.state_change, a.wait_event_type, a.query
		  from pg_catalog.pg_stat_activity a
		  where a.datname = pg_catalog.current_database() and a.pid <> pg_catalog.pg_backend_pid()
		    and coalesce(a.backend_type, 'client backend') = 'client backend' -- null: hidden from this role
		),
		l as (
		  select * from a
		  where a.xact_start < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
		     or (a.state like 'idle in transaction%' and a.state_change < pg_catalog.now() - pg_catalog.make_interval(secs => $3))
		)
		select (select pg_catalog.count(*) from l),
		       (select pg_catalog.count(*) from a where a.query = '<insufficient privilege>'),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'user', l.usename, 'application_name', l.application_name,
		                  'state', l.state, 'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)),
		                  'state_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.state_change)),
		                  'wait_event_type', l.wait_event_type, 'query', pg_catalog.left(l.query, 120))
		         from l order by l.xact_start limit $1))`, env.Sample, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)).Scan(&n, &hidden, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	var out []Finding
	if n > 0 {
		out = append(out, c.finding(n, false, fmt.Sprintf("%d session(s) with a transaction open over %gs or idle in transaction over %gs",
			n, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)), samples))
	}
	if hidden > 0 {
		f := c.finding(hidden, false, fmt.Sprintf("%d session(s) of other roles are not visible to this role (their state and transaction age are hidden)", hidden), nil)
		f.Severity, f.Remedy = Info, "Run the audit as a role with pg_read_all_stats (or pg_monitor) to see every session."
		out = append(out, f)
	}
	return out, nil
}

func checkLocksOnPgflow(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("sessions.locks_on_pgflow")
	var n int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with l as materialized (
		  select l.pid, l.mode, l.granted, c.relname::text as relname, a.usename, a.application_name, a.state, a.xact_start
		  from pg_catalog.pg_locks l
		  join pg_catalog.pg_class c on c.oid = l.relation
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgflow'
		  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
		  where l.locktype = 'relation'
		    and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = pg_catalog.current_database())
		    and l.pid <> pg_catalog.pg_backend_pid()
		    and (l.mode not in ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
		         or not l.granted
		         or a.xact_start < pg_catalog.now() - interval '5 seconds')
		)
		select (select pg_catalog.count(*) from l),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'table', 'pgflow.' || l.relname, 'mode', l.mode, 'granted', l.granted,
		                  'user', l.usename, 'application_name', l.application_name, 'state', l.state,
		                  'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)))
		         from l order by l.granted desc, l.xact_start nulls last, l.pid limit $1))`, env.Sample).Scan(&n, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_locks: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, false, fmt.Sprintf("%d lock(s) on pgflow tables that apply would wait behind", n), samples)}, nil
}

func checkSizes(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("size.tables")
	rows, err := q.Query(ctx, `
		select n.nspname::text, c.relname::text, c.reltuples::bigint, pg_catalog.pg_total_relation_size(c.oid)
		from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		where c.relkind in ('r', 'p')
		  and (n.nspname = 'pgflow'
		       or (n.nspname = 'pgmq' and (c.relname::text like 'q\_%' or c.relname::text like 'a\_%')))
		order by 4 desc, 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", err)
	}
	defer rows.Close()
	type size struct {
		schema, table string
		rows, bytes   int64
	}
	var pgflowT, queueT []size
	var stepTasks *size
	var pgflowBytes, queueBytes, queueRows int64
	for rows.Next() {
		var s size
		if err := rows.Scan(&s.schema, &s.table, &s.rows, &s.bytes); err != nil {
			return nil, fmt.Errorf("reading table sizes: %w", err)
		}
		if s.schema == "pgflow" {
			pgflowT = append(pgflowT, s)
			pgflowBytes += s.bytes
			if s.table == "step_tasks" {
				st := s
				stepTasks = &st
			}
		} else {
			queueT = append(queueT, s)
			queueBytes += s.bytes
			if s.rows > 0 {
				queueRows += s.rows
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", err)
	}
	toSamples := func(list []size) []map[string]any {
		var out []map[string]any
		for _, s := range list {
			if len(out) >= env.Sample {
				break
			}
			out = append(out, map[string]any{"table": s.schema + "." + s.table, "rows_estimate": s.rows, "bytes": s.bytes, "size": humanBytes(s.bytes)})
		}
		return out
	}
	var out []Finding
	f := c.finding(int64(len(pgflowT)), false, fmt.Sprintf("%d pgflow tables, %s in total", len(pgflowT), humanBytes(pgflowBytes)), toSamples(pgflowT))
	out = append(out, f)
	f = c.finding(int64(len(queueT)), false, fmt.Sprintf("%d pgmq queue tables, %s in total, about %d messages", len(queueT), humanBytes(queueBytes), queueRows), toSamples(queueT))
	out = append(out, f)
	if stepTasks != nil && env.Schema.State != StateUpgraded {
		rowsText := fmt.Sprintf("about %d rows", stepTasks.rows)
		if stepTasks.rows < 0 {
			rowsText = "row count unknown: never analyzed"
		}
		f = c.finding(max(stepTasks.rows, 0), false, fmt.Sprintf("backfill: pgflow.step_tasks (%s, %s with indexes) is rewritten under ACCESS EXCLUSIVE",
			rowsText, humanBytes(stepTasks.bytes)),
			[]map[string]any{{"table": "pgflow.step_tasks", "rows_estimate": stepTasks.rows, "bytes": stepTasks.bytes, "size": humanBytes(stepTasks.bytes)}})
		out = append(out, f)
	}
	return out, nil
}

func humanBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func checkBackup(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("backup.pgdump_pgmq")
	var queues, unlogged int64
	var samples, unloggedSamples []map[string]any
	err := q.QueryRow(ctx, `
		with l as materialized (select l.queue_name::text as queue_name, l.is_unlogged from pgmq.list_queues() l)
		select (select pg_catalog.count(*) from l),
		       (select pg_catalog.count(*) from l where l.is_unlogged),
		       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', l.queue_name) from l order by l.queue_name limit $1)),
		       pg_catalog.to_jsonb(array(select pg_catalog.jsonb_build_object('queue', l.queue_name, 'unlogged', true) from l where l.is_unlogged order by l.queue_name limit $1))`,
		env.Sample).Scan(&queues, &unlogged, &samples, &unloggedSamples)
	if err != nil {
		return nil, fmt.Errorf("listing queues with pgmq.list_queues(): %w", err)
	}
	var out []Finding
	if env.PGMQ.Kind == "extension" {
		out = append(out, c.finding(queues, false,
			fmt.Sprintf("pgmq is an extension: pg_dump leaves out pgmq.meta and the tables and messages of all %d queue(s)", queues), samples))
	}
	if unlogged > 0 {
		f := c.finding(unlogged, false, fmt.Sprintf("%d unlogged queue(s): their messages are lost on a crash and absent from physical backups and replicas", unlogged), unloggedSamples)
		f.Remedy = "Export their messages before apply, or recreate them as logged queues when they are empty."
		out = append(out, f)
	}
	return out, nil
}

// seconds of d, or def when d is unset.
func seconds(d time.Duration, def float64) float64 {
	if d <= 0 {
		return def
	}
	return d.Seconds()
}

// countText renders a count, "at least N" when bounded.
func countText(n int64, atLeast bool) string {
	if atLeast {
		return fmt.Sprintf("at least %d", n)
	}
	return fmt.Sprint(n)
}
