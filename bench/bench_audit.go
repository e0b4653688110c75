package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// The audit must stay bounded: its wall time may not grow with the tables.
func init() {
	Register(Benchmark{
		Name: "audit",
		Goal: "audit wall time under 2 s at 1M and 5M step_tasks rows, 5M within 1.5x of 1M",
		Run:  benchAudit,
	})
}

func benchAudit(ctx context.Context, env *Env) ([]Row, error) {
	var rows []Row
	for _, size := range env.Sizes {
		dsn, drop, err := env.Clone(ctx, size)
		if err != nil {
			return nil, err
		}
		var times []time.Duration
		var checks int
		for i := 0; i < env.Repeat; i++ {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				drop()
				return nil, err
			}
			start := time.Now()
			rep, err := audit.Run(ctx, conn, audit.Options{})
			times = append(times, time.Since(start))
			conn.Close(ctx)
			if err != nil {
				drop()
				return nil, fmt.Errorf("audit at %d rows: %w", size, err)
			}
			checks = len(rep.Checks)
			if n := rep.Inconclusive(); n > 0 {
				env.Logf("bench: audit at %d rows: %d checks inconclusive", size, n)
			}
		}
		drop()
		rows = append(rows, Row{Benchmark: "audit", Case: fmt.Sprintf("%d step_tasks", size), Metrics: []Metric{
			{"wall", Median(times).Seconds(), "s"},
			{"checks", float64(checks), ""},
		}})
	}
	return rows, nil
}
