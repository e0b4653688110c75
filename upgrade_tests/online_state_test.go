package upgrade_tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// inflightState drives the real pgflow 0.16.0 engine into a seeded in-flight
// state for the online tests: flows in mixed case (their 0.17.0 queue_name is
// lower(flow_slug)), DAG and map steps, runs with tasks queued, started,
// completed, retried and failed, messages visible and invisible. Only the
// engine's own functions write pgflow rows.
func inflightState(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand) error {
	const worker = "00000000-0000-4000-8000-00000000b001"
	exec := func(sql string, args ...any) error {
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("in-flight state: %s: %w", strings.Join(strings.Fields(sql), " "), err)
		}
		return nil
	}
	flows := []string{"Online_Dag", "online_map"}
	steps := []string{
		`select pgflow.create_flow('Online_Dag', max_attempts => 3, base_delay => 0)`,
		`select pgflow.add_step('Online_Dag', 'first')`,
		`select pgflow.add_step('Online_Dag', 'second', array['first'])`,
		`select pgflow.create_flow('online_map', max_attempts => 2, base_delay => 0)`,
		`select pgflow.add_step('online_map', 'each', step_type => 'map')`,
		`insert into pgflow.workers (worker_id, queue_name, function_name) values ('` + worker + `', 'online_map', 'fn')`,
	}
	for _, s := range steps {
		if err := exec(s); err != nil {
			return err
		}
	}
	for i, n := 0, 3+rng.IntN(4); i < n; i++ {
		if err := exec(`select pgflow.start_flow('Online_Dag', '{"i": 1}')`); err != nil {
			return err
		}
		items := make([]string, 1+rng.IntN(25))
		for j := range items {
			items[j] = fmt.Sprint(j)
		}
		if err := exec(`select pgflow.start_flow('online_map', $1::jsonb)`, "["+strings.Join(items, ",")+"]"); err != nil {
			return err
		}
	}
	// A 0.16.0 worker claims some messages of each flow, then completes or
	// fails some of what it claimed (a failure with attempts left is a retry).
	for _, f := range flows {
		if err := exec(`select count(*) from pgflow.start_tasks($1, array(select msg_id from pgmq.read($1, 60, $2)), $3::uuid)`,
			f, 1+rng.IntN(30), worker); err != nil {
			return err
		}
	}
	rows, err := pool.Query(ctx, `select run_id::text, step_slug, task_index from pgflow.step_tasks where status = 'started' order by run_id, step_slug, task_index`)
	if err != nil {
		return err
	}
	type task struct {
		run, step string
		index     int
	}
	var started []task
	for rows.Next() {
		var t task
		if err := rows.Scan(&t.run, &t.step, &t.index); err != nil {
			rows.Close()
			return err
		}
		started = append(started, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range started {
		switch rng.IntN(3) {
		case 0:
			if err := exec(`select count(*) from pgflow.complete_task($1::uuid, $2, $3, '"done"'::jsonb)`, t.run, t.step, t.index); err != nil {
				return err
			}
		case 1:
			if err := exec(`select count(*) from pgflow.fail_task($1::uuid, $2, $3, 'failed in the fixture')`, t.run, t.step, t.index); err != nil {
				return err
			}
		}
	}
	return nil
}
