package audit

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The checks for what makes the 0.16.0 → 0.17.0 migration fail (its unique
// indexes, CHECKs and re-added slug constraints) or what changes under it
// (queues, workers). Each counts exactly over small tables (flows, steps,
// workers, pgmq.list_queues()); the one big table is in duplicates.go.

func checkCaseAlias(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var groups, flows int64
	var samples []map[string]any
	err := scanTable(ctx, q, "flows", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with g as (
		  select pg_catalog.lower(f.flow_slug) as queue, pg_catalog.array_agg(f.flow_slug order by f.flow_slug) as slugs
		  from pgflow.flows f
		  group by pg_catalog.lower(f.flow_slug)
		  having pg_catalog.count(*) > 1
		)
		select (select pg_catalog.count(*) from g),
		       (select coalesce(pg_catalog.sum(pg_catalog.cardinality(g.slugs)), 0)::bigint from g),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('queue', g.queue, 'queue_table', 'pgmq.q_' || g.queue,
		                  'flow_slugs', pg_catalog.array_to_string(g.slugs, ', '))
		         from g order by g.queue limit $1))`, env.Sample).Scan(&groups, &flows, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("grouping flow slugs case-insensitively: %w", err)
	}
	if groups == 0 {
		return nil, nil
	}
	return []Finding{c.finding(groups, fmt.Sprintf("%d group(s) of flow slugs that differ only in case (%d flows): "+
		"the unique index on lower(flow_slug) cannot be built", groups, flows), samples)}, nil
}

func checkStepCaseAlias(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var groups, steps int64
	var samples []map[string]any
	err := scanTable(ctx, q, "steps", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with g as (
		  select s.flow_slug, pg_catalog.lower(s.step_slug) as lowered, pg_catalog.array_agg(s.step_slug order by s.step_slug) as slugs
		  from pgflow.steps s
		  group by s.flow_slug, pg_catalog.lower(s.step_slug)
		  having pg_catalog.count(*) > 1
		)
		select (select pg_catalog.count(*) from g),
		       (select coalesce(pg_catalog.sum(pg_catalog.cardinality(g.slugs)), 0)::bigint from g),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('flow_slug', g.flow_slug, 'step_slugs', pg_catalog.array_to_string(g.slugs, ', '))
		         from g order by g.flow_slug, g.lowered limit $1))`, env.Sample).Scan(&groups, &steps, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("grouping step slugs case-insensitively: %w", err)
	}
	if groups == 0 {
		return nil, nil
	}
	return []Finding{c.finding(groups, fmt.Sprintf("%d group(s) of steps of one flow whose slugs differ only in case (%d steps): "+
		"the unique index on (flow_slug, lower(step_slug)) cannot be built", groups, steps), samples)}, nil
}

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

func checkSlugRule(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var flows, steps int64
	var samples []map[string]any
	err := scanTable(ctx, q, "steps", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, slugRuleSQL, env.Sample).Scan(&flows, &steps, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("checking slugs against the 0.17.0 rule: %w", err)
	}
	if flows+steps == 0 {
		return nil, nil
	}
	return []Finding{c.finding(flows+steps, fmt.Sprintf("%d slug(s) break 0.17.0's slug rule (%d flow slug(s), %d step slug(s)): "+
		"re-adding slug_is_valid and steps_step_slug_check fails", flows+steps, flows, steps), samples)}, nil
}

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

func checkQueueNameLength(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var long []longFlow
	err := scanTable(ctx, q, "flows", func(int64) (int64, error) {
		rows, err := q.Query(ctx, queueNameLengthSQL, versions.MaxQueueNameLength)
		if err != nil {
			return 0, err
		}
		var stepless []string
		for rows.Next() {
			var f longFlow
			if err := rows.Scan(&f.slug, &f.length, &f.steps); err != nil {
				rows.Close()
				return 0, err
			}
			if !f.steps {
				stepless = append(stepless, f.slug)
			}
			long = append(long, f)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(stepless) == 0 {
			return 0, err
		}
		var withTasks []string
		if err := q.QueryRow(ctx, `select array(select distinct t.flow_slug from pgflow.step_tasks t where t.flow_slug = any($1::text[]))`,
			stepless).Scan(&withTasks); err != nil {
			return 0, err
		}
		for i := range long {
			long[i].tasks = slices.Contains(withTasks, long[i].slug)
		}
		return 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("measuring queue names (lower(flow_slug)): %w", err)
	}
	var blocking, warning []map[string]any
	var nb, nw int64
	for _, f := range long {
		sample := map[string]any{"flow_slug": f.slug, "length": f.length, "has_steps": f.steps, "has_tasks": f.tasks}
		if f.steps || f.tasks {
			if nb++; len(blocking) < env.Sample {
				blocking = append(blocking, sample)
			}
		} else if nw++; len(warning) < env.Sample {
			warning = append(warning, sample)
		}
	}
	var out []Finding
	if nb > 0 {
		out = append(out, c.finding(nb, fmt.Sprintf("%d flow(s) with steps or tasks whose queue name lower(flow_slug) is longer than pgmq's %d characters: "+
			"queue_name_is_valid rejects their steps and tasks", nb, versions.MaxQueueNameLength), blocking))
	}
	if nw > 0 {
		f := c.finding(nw, fmt.Sprintf("%d flow(s) without steps or tasks whose queue name lower(flow_slug) is longer than pgmq's %d characters: "+
			"the upgrade applies, but the flow cannot get steps afterwards", nw, versions.MaxQueueNameLength), warning)
		f.Severity, f.Remedy = Warning, queueNameStepless
		out = append(out, f)
	}
	return out, nil
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

func checkLegacyWorkers(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	if env.Schema.State == versions.SchemaUpgraded {
		return nil, nil // no 0.16.0 worker can claim here; live ones are 0.17's
	}
	live := env.LiveWorker
	if live <= 0 {
		live = time.Minute
	}
	var n int64
	var samples []map[string]any
	err := scanTable(ctx, q, "workers", func(int64) (int64, error) {
		return 0, q.QueryRow(ctx, `
		with w as (
		  select w.worker_id, w.queue_name, w.function_name, w.started_at, w.last_heartbeat_at
		  from pgflow.workers w
		  where w.stopped_at is null and w.deprecated_at is null
		    and w.last_heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => $2)
		)
		select (select pg_catalog.count(*) from w),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('worker_id', w.worker_id, 'queue', w.queue_name, 'function_name', w.function_name,
		                  'started_at', w.started_at, 'heartbeat_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - w.last_heartbeat_at)))
		         from w order by w.last_heartbeat_at desc, w.worker_id limit $1))`, env.Sample, live.Seconds()).Scan(&n, &samples)
	})
	if err != nil {
		return nil, fmt.Errorf("reading live workers from pgflow.workers: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d 0.16.0 worker(s) alive (not stopped or deprecated, heartbeat within %s)", n, live), samples)}, nil
}
