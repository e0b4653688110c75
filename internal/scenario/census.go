package scenario

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
)

// Census counts the kinds of in-flight state a database holds, so a scenario
// can show that the state it upgraded really had every kind it claims.
type Census map[string]int

// Kinds a clean-upgrade state must hold (queued, started, retried,
// completed, failed, cancelled, skipped, archived, map steps with many
// tasks, conditions).
var inflightKinds = []string{
	"run started", "run completed", "run failed",
	"task queued", "task started", "task retried", "task completed", "task failed",
	"task cancelled", "task skipped",
	"step skipped condition_unmet", "step skipped dependency_skipped", "step skipped handler_failed",
	"step with a condition", "map step with >= 3 tasks",
	"message visible", "message invisible", "message archived",
}

// TakeCensus counts the kinds. It reads pgmq's tables directly (test tool).
func TakeCensus(ctx context.Context, pool *pgxpool.Pool) (Census, error) {
	c := Census{}
	queries := map[string]string{
		"run":  `select 'run ' || status, count(*) from pgflow.runs group by 1`,
		"task": `select 'task ' || status, count(*) from pgflow.step_tasks group by 1`,
		"step": `select 'step ' || status || coalesce(' ' || skip_reason, ''), count(*) from pgflow.step_states group by 1`,
		"conditions": `select 'step with a condition', count(*) from pgflow.steps
		               where required_input_pattern is not null or forbidden_input_pattern is not null`,
		"retried": `select 'task retried', count(*) from pgflow.step_tasks
		            where attempts_count > 0 and status = 'queued'`,
		"map": `select 'map step with >= 3 tasks', count(*) from pgflow.step_states ss
		        join pgflow.steps s on s.flow_slug = ss.flow_slug and s.step_slug = ss.step_slug
		        where s.step_type = 'map' and ss.initial_tasks >= 3`,
		"stalled": `select 'task permanently stalled', count(*) from pgflow.step_tasks where permanently_stalled_at is not null`,
	}
	for what, q := range queries {
		if err := census(ctx, pool, c, q); err != nil {
			return nil, fmt.Errorf("census of %s: %w", what, err)
		}
	}
	queues, err := capture.QueueNames(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, q := range queues {
		qt := pgx.Identifier{"pgmq", "q_" + strings.ToLower(q)}.Sanitize()
		at := pgx.Identifier{"pgmq", "a_" + strings.ToLower(q)}.Sanitize()
		sql := `select 'message visible', count(*) filter (where vt <= clock_timestamp()) from ` + qt + `
		        union all select 'message invisible', count(*) filter (where vt > clock_timestamp()) from ` + qt + `
		        union all select 'message archived', count(*) from ` + at
		if err := census(ctx, pool, c, sql); err != nil {
			return nil, fmt.Errorf("census of queue %q: %w", q, err)
		}
	}
	return c, nil
}

func census(ctx context.Context, pool *pgxpool.Pool, c Census, sql string) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		c[k] += n
	}
	return rows.Err()
}

// Missing lists the kinds with no instance.
func (c Census) Missing(kinds []string) []string {
	var out []string
	for _, k := range kinds {
		if c[k] == 0 {
			out = append(out, k)
		}
	}
	return out
}

func (c Census) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if c[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
		}
	}
	return strings.Join(parts, ", ")
}
