package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// apply against the two psql references (bench_apply_refs.go), side by side in one run.
func init() {
	Register(Benchmark{
		Name: "apply",
		Goal: "apply total time within 1.2x of the one-pass rewrite; ACCESS EXCLUSIVE window reported",
		Run:  benchApply,
	})
}

func benchApply(ctx context.Context, env *Env) ([]Row, error) {
	var rows []Row
	for _, size := range env.Sizes {
		var total, window []time.Duration
		for i := 0; i < env.Repeat; i++ {
			dsn, drop, err := env.Clone(ctx, size)
			if err != nil {
				return nil, err
			}
			conn, err := session.Open(ctx, dsn, session.Rehearsal)
			if err != nil {
				drop()
				return nil, err
			}
			start := time.Now()
			rep, err := upgrade.Apply(ctx, conn, upgrade.Options{})
			took := time.Since(start)
			conn.Close(ctx)
			drop()
			if err == nil {
				err = rep.Want(outcome.Applied)
			}
			if err != nil {
				return nil, fmt.Errorf("apply at %d rows: %w", size, err)
			}
			total = append(total, took)
			window = append(window, time.Duration(rep.Report.LockWindowMS)*time.Millisecond)
		}
		rows = append(rows, Row{Benchmark: "apply", Case: fmt.Sprintf("pgflow-upgrade apply, %d step_tasks", size), Metrics: []Metric{
			{"total", Median(total).Seconds(), "s"},
			{"ACCESS EXCLUSIVE window", Median(window).Seconds(), "s"},
		}})
		refs, err := measureReferences(ctx, env, size)
		if err != nil {
			return nil, err
		}
		rows = append(rows, refs...)
	}
	return rows, nil
}
