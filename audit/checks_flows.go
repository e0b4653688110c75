package audit

import (
	"context"
	"fmt"
	"slices"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// flowsCaseAlias is flows.case_alias.
var flowsCaseAlias = Check{
	ID: "flows.case_alias", Title: "flows whose slugs differ only in case", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow,
	Meaning: "0.17.0 creates a unique index on lower(flow_slug) (every flow's queue is lower(flow_slug)); the migration fails while two flows " +
		"differ only in case (MyFlow, myflow). Such flows already share one physical queue on 0.16.0 (pgmq names tables in lower case).",
	Remedy: "Keep one slug of each group: let the others' runs finish, then delete them (select pgflow.delete_flow_and_data('<slug>')) " +
		"and point their workers at the kept slug; audit again.",
	Run: checkCaseAlias,
}

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

// flowsQueueNameTooLong is flows.queue_name_too_long.
var flowsQueueNameTooLong = Check{
	ID: "flows.queue_name_too_long", Title: "queue names over pgmq's 47 characters", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow,
	Meaning: "0.17.0 stores each step's and task's queue as lower(flow_slug) under CHECK is_valid_queue_name (at most 47 characters, pgmq's limit); " +
		"the migration fails on a flow whose slug is longer and has steps or tasks (a blocker). A longer-slug flow with neither does not stop it " +
		"(only steps and tasks get queue_name), but can never get steps under 0.17.0 (a warning).",
	Remedy: "Let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<slug>')) and compile it again under a slug of at most 47 characters; audit again.",
	Run:    checkQueueNameLength,
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
