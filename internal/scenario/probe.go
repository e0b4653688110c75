package scenario

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitProbe is a client of the database during `apply --online`: every
// 10 ms a SELECT and an UPDATE (to the same values) of one task row, each
// bounded by lock_timeout 5 s; it records the longest either waited. A
// database with no task reads step_tasks only.
type waitProbe struct {
	mu      sync.Mutex
	longest time.Duration
	n       int
	fails   int
}

func (p *waitProbe) result() (time.Duration, int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.longest, p.n, p.fails
}

// run probes until ctx ends; ready is closed once the first round is done.
func (p *waitProbe) run(ctx context.Context, dsn string, ready chan<- struct{}) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = "pgflow-upgrade replay probe"
	cfg.RuntimeParams["lock_timeout"] = "5s"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("probe: connecting: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	queries := []string{`select pg_catalog.count(*) from (select 1 from pgflow.step_tasks limit 1) t`}
	var args []any
	var run, step string
	var idx int
	err = conn.QueryRow(ctx, `select run_id::text, step_slug, task_index from pgflow.step_tasks
		order by (status operator(pg_catalog.=) 'queued') desc limit 1`).Scan(&run, &step, &idx)
	switch {
	case err == nil:
		args = []any{run, step, idx}
		queries = []string{
			`select pg_catalog.count(*) from pgflow.step_tasks where run_id operator(pg_catalog.=) $1::uuid and step_slug operator(pg_catalog.=) $2 and task_index operator(pg_catalog.=) $3`,
			`update pgflow.step_tasks set attempts_count = attempts_count where run_id operator(pg_catalog.=) $1::uuid and step_slug operator(pg_catalog.=) $2 and task_index operator(pg_catalog.=) $3`,
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("probe: picking a task row: %w", err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	first := true
	for {
		for _, q := range queries {
			t := time.Now()
			_, err := conn.Exec(ctx, q, args...)
			d := time.Since(t)
			if ctx.Err() != nil {
				return nil
			}
			p.mu.Lock()
			p.n++
			if d > p.longest {
				p.longest = d
			}
			if err != nil {
				p.fails++
			}
			p.mu.Unlock()
		}
		if first {
			first = false
			close(ready)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
