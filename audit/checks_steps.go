package audit

import (
	"context"
	"fmt"
)

// stepsCaseAlias is steps.case_alias.
var stepsCaseAlias = Check{
	ID: "steps.case_alias", Title: "steps of one flow whose slugs differ only in case", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs:   NeedsPgflow,
	Meaning: "0.17.0 creates a unique index on steps (flow_slug, lower(step_slug)); the migration fails while two steps of one flow differ only in case.",
	Remedy: "A flow's steps cannot be renamed in place: let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<flow>')) " +
		"and compile it again with step slugs that differ in more than case (the worker recompiles it at startup); audit again.",
	Run: checkStepCaseAlias,
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
