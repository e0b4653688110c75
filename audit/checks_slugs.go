package audit

import (
	"context"
	"fmt"
)

// slugsStrictRule is slugs.strict_rule.
var slugsStrictRule = Check{
	ID: "slugs.strict_rule", Title: "slugs that break 0.17.0's slug rule", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs: NeedsPgflow,
	Meaning: "0.17.0's is_valid_slug adds to 0.16.0's rule: the first character is a letter, the last a letter or digit, and no \"__\". " +
		"The migration re-adds flows.slug_is_valid and steps.steps_step_slug_check, which re-checks every existing flow and step slug; one bad slug fails it.",
	Remedy: "Slugs cannot be renamed in place: let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<flow>')), " +
		"rename the flow or step in the worker code to a valid slug (e.g. _import → import_, a__b → a_b) and let the worker compile it; audit again.",
	Run: checkSlugRule,
}

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
