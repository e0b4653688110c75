// Package datagen generates real-shaped pgflow 0.16.0 data: millions of
// step_tasks rows, most of them finished, plus a live tail of in-flight runs
// created through the engine itself. The benchmarks (bench/) and the audit's
// forecast sample (internal/calibrate) share it.
package datagen

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is a connection, pool or transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Shape says how much data Generate makes.
type Shape struct {
	// Tasks is the number of finished step_tasks rows (completed runs).
	Tasks int64
	// Flows spreads the rows over this many flows (and queues). Default 10.
	Flows int
	// TasksPerRun is the fan-out of each finished run's map step. Default 1000.
	TasksPerRun int
	// LiveRuns are started through pgflow.start_flow, so their tasks have real
	// queued messages. Default 20, each with LiveTasksPerRun tasks (default 50).
	LiveRuns        int
	LiveTasksPerRun int
}

func (s *Shape) defaults() {
	if s.Flows <= 0 {
		s.Flows = 10
	}
	if s.TasksPerRun <= 0 {
		s.TasksPerRun = 1000
	}
	if s.LiveRuns <= 0 {
		s.LiveRuns = 20
	}
	if s.LiveTasksPerRun <= 0 {
		s.LiveTasksPerRun = 50
	}
}

// FlowSlug names the i-th generated flow.
func FlowSlug(i int) string { return fmt.Sprintf("bench_flow_%02d", i) }

// Generate fills a database that holds the empty 0.16.0 baseline. Finished
// rows are written set-wise (generate_series), their message ids drawn from
// the flow's real queue with pgmq.send_batch and then purged, so ids are
// unique per queue exactly as in production. It returns how long it took.
func Generate(ctx context.Context, db DB, shape Shape) (time.Duration, error) {
	shape.defaults()
	start := time.Now()
	perFlow := shape.Tasks / int64(shape.Flows)
	for f := 0; f < shape.Flows; f++ {
		slug := FlowSlug(f)
		steps := []string{
			`select pgflow.create_flow($1, max_attempts => 3, base_delay => 1, timeout => 60)`,
			`select pgflow.add_step($1, 'items', step_type => 'map')`,
			`select pgflow.add_step($1, 'summary', array['items'])`,
		}
		for _, q := range steps {
			if _, err := db.Exec(ctx, q, slug); err != nil {
				return 0, fmt.Errorf("creating flow %s: %w", slug, err)
			}
		}
		if perFlow > 0 {
			if err := finishedRuns(ctx, db, slug, perFlow, shape.TasksPerRun); err != nil {
				return 0, err
			}
		}
		if err := liveRuns(ctx, db, slug, shape.LiveRuns/shape.Flows+1, shape.LiveTasksPerRun); err != nil {
			return 0, err
		}
	}
	if _, err := db.Exec(ctx, `analyze`); err != nil {
		return 0, fmt.Errorf("analyze: %w", err)
	}
	return time.Since(start), nil
}

// finishedRuns writes completed runs with tasks completed tasks in all.
func finishedRuns(ctx context.Context, db DB, slug string, tasks int64, perRun int) error {
	runs := (tasks + int64(perRun) - 1) / int64(perRun)
	// Deterministic run ids: md5 of slug and run number.
	stmts := []struct {
		what, sql string
		args      []any
	}{
		{"runs", `insert into pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, started_at, completed_at)
		          select md5($1 || ':' || r)::uuid, $1, 'completed', '[]'::jsonb, '{"summary": 1}'::jsonb, 0,
		                 now() - interval '2 days', now() - interval '1 day'
		          from generate_series(0, $2 - 1) r`, []any{slug, runs}},
		// created_at before started_at: real 0.16.0 checks started_at_is_after_created_at.
		{"step_states", `insert into pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, initial_tasks,
		                   remaining_deps, output, created_at, started_at, completed_at)
		          select $1, md5($1 || ':' || r)::uuid, s.step_slug, 'completed', 0, case s.step_slug when 'items' then $3::int else 1 end,
		                 0, '1'::jsonb, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
		          from generate_series(0, $2 - 1) r cross join (values ('items'), ('summary')) s(step_slug)`, []any{slug, runs, perRun}},
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s.sql, s.args...); err != nil {
			return fmt.Errorf("generating %s for %s: %w", s.what, slug, err)
		}
	}
	// Tasks in chunks, so one statement never builds a huge array.
	const chunk = 200_000
	for off := int64(0); off < tasks; off += chunk {
		n := min(chunk, tasks-off)
		_, err := db.Exec(ctx, `
			with ids as (
			  select m.id, $2::bigint + row_number() over (order by m.id) - 1 as rn
			  from pgmq.send_batch($1, array_fill('{}'::jsonb, array[$3::int])) as m(id)
			)
			insert into pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, task_index, status, attempts_count,
			                               output, queued_at, started_at, completed_at)
			select $1, md5($1 || ':' || (rn / $4))::uuid, 'items', id, (rn % $4)::int, 'completed', 1,
			       '1'::jsonb, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
			from ids`, slug, off, n, perRun)
		if err != nil {
			return fmt.Errorf("generating step_tasks %d..%d for %s: %w", off, off+n, slug, err)
		}
		// The messages only reserved ids; finished tasks have none left.
		if _, err := db.Exec(ctx, `select pgmq.purge_queue($1)`, slug); err != nil {
			return fmt.Errorf("purging %s: %w", slug, err)
		}
	}
	// The summary step's single task per run.
	_, err := db.Exec(ctx, `
		with ids as (
		  select m.id, row_number() over (order by m.id) - 1 as rn
		  from pgmq.send_batch($1, array_fill('{}'::jsonb, array[$2::int])) as m(id)
		)
		insert into pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, task_index, status, attempts_count,
		                               output, queued_at, started_at, completed_at)
		select $1, md5($1 || ':' || rn)::uuid, 'summary', id, 0, 'completed', 1, '1'::jsonb,
		       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
		from ids`, slug, runs)
	if err != nil {
		return fmt.Errorf("generating summary tasks for %s: %w", slug, err)
	}
	_, err = db.Exec(ctx, `select pgmq.purge_queue($1)`, slug)
	return err
}

// liveRuns starts runs through the engine: queued tasks with real messages.
func liveRuns(ctx context.Context, db DB, slug string, runs, perRun int) error {
	for r := 0; r < runs; r++ {
		_, err := db.Exec(ctx, `select pgflow.start_flow($1, (select jsonb_agg(i) from generate_series(1, $2::int) i))`, slug, perRun)
		if err != nil {
			return fmt.Errorf("starting a live run of %s: %w", slug, err)
		}
	}
	return nil
}
