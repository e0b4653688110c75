// Package waitprobe stands in for the application while an upgrade runs: one
// connection that every 10 ms reads and updates (to the same values) one task
// row of pgflow.step_tasks, each statement bounded by lock_timeout 5 s, and
// records the longest any statement waited. The benchmarks and the rehearsal
// (`fixtures replay --from`) measure `apply --online` with it.
package waitprobe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Probe is one probing client. The zero value reads and updates; set
// ReadOnly for a SELECT only (a change with no trigger to fill the rows an
// UPDATE would move, as the benchmark's floor).
type Probe struct {
	ReadOnly        bool
	ApplicationName string // default "pgflow-upgrade wait probe"

	mu       sync.Mutex
	longest  time.Duration
	n, fails int
	errs     []string // the first three failures
}

// Result is what a probe measured.
type Result struct {
	Longest    time.Duration // the longest any statement took
	Statements int
	Failures   int      // statements that failed (a lock_timeout, most likely)
	Errors     []string // the first three failures' messages
}

// Result returns what the probe measured so far.
func (p *Probe) Result() Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Result{Longest: p.longest, Statements: p.n, Failures: p.fails, Errors: append([]string(nil), p.errs...)}
}

const taskKey = `run_id operator(pg_catalog.=) $1::uuid and step_slug operator(pg_catalog.=) $2 and task_index operator(pg_catalog.=) $3`

// Run probes until ctx ends. ready, when not nil, is closed once the first
// round is done (the probe is connected and has its row). The row is a
// queued task, else any task; a database with no task is probed by reading
// step_tasks only.
func (p *Probe) Run(ctx context.Context, dsnText string, ready chan<- struct{}) error {
	name := p.ApplicationName
	if name == "" {
		name = "pgflow-upgrade wait probe"
	}
	// A rehearsal session (pinned), though the probe plays the application:
	// it runs inside the tool, on the database being upgraded, and its SQL
	// names every schema and operator.
	conn, err := session.OpenWith(ctx, dsnText, session.Options{Purpose: session.Rehearsal, Name: name,
		Settings: map[string]string{"lock_timeout": "5s"}})
	if errors.Is(err, session.ErrMalformed) {
		return fmt.Errorf("wait probe: %w", err)
	}
	if err != nil {
		return fmt.Errorf("wait probe: connecting: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	queries := []string{`select pg_catalog.count(*) from (select 1 from pgflow.step_tasks limit 1) t`}
	var args []any
	var run, step string
	var idx int
	err = conn.QueryRow(ctx, `select run_id::text, step_slug, task_index from pgflow.step_tasks
		where status operator(pg_catalog.=) 'queued' limit 1`).Scan(&run, &step, &idx)
	if errors.Is(err, pgx.ErrNoRows) {
		err = conn.QueryRow(ctx, `select run_id::text, step_slug, task_index from pgflow.step_tasks limit 1`).Scan(&run, &step, &idx)
	}
	switch {
	case err == nil:
		args = []any{run, step, idx}
		queries = []string{`select pg_catalog.count(*) from pgflow.step_tasks where ` + taskKey}
		if !p.ReadOnly {
			queries = append(queries, `update pgflow.step_tasks set attempts_count = attempts_count where `+taskKey)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("wait probe: picking a task row: %w", err)
	}

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, q := range queries {
			start := time.Now()
			_, err := conn.Exec(ctx, q, args...)
			took := time.Since(start)
			if ctx.Err() != nil {
				return nil
			}
			p.record(took, err)
		}
		if ready != nil {
			close(ready)
			ready = nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (p *Probe) record(took time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	p.longest = max(p.longest, took)
	if err != nil {
		p.fails++
		if len(p.errs) < 3 {
			p.errs = append(p.errs, err.Error())
		}
	}
}
