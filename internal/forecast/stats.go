package forecast

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Stats are the row counts the forecast uses, from the planner's
// statistics: never a scan.
type Stats struct {
	StepTasks  int64 `json:"step_tasks"`
	StepStates int64 `json:"step_states"`
	Runs       int64 `json:"runs"`
	// Workers and WorkerFunctions: the small tables some hops lock.
	Workers         int64 `json:"workers"`
	WorkerFunctions int64 `json:"worker_functions"`
	// Source says where the counts come from (see ReadStats).
	Source string `json:"source"`
	// LastAnalyzed: the latest ANALYZE of pgflow.step_tasks (manual or
	// autovacuum's), nil when never.
	LastAnalyzed *time.Time `json:"last_analyzed,omitempty"`
}

// Sources of Stats.
const (
	SourceReltuples = "pg_class.reltuples (as of the table's last ANALYZE or VACUUM)"
	SourceLiveTup   = "pg_stat_user_tables.n_live_tup (the table was never analyzed)"
)

// statsSQL reads, per table, reltuples (what the last ANALYZE or VACUUM
// saw) and the statistics' live-row count: catalog and statistics views
// only, so it takes no lock on pgflow's tables (pg_relation_size would take
// ACCESS SHARE, and wait behind an apply's locks).
const statsSQL = `
select c.relname::text,
       c.reltuples::float8,
       coalesce(s.n_live_tup, 0)::float8,
       greatest(s.last_analyze, s.last_autoanalyze)
from pg_catalog.pg_class c
join pg_catalog.pg_namespace n on n.oid = c.relnamespace
left join pg_catalog.pg_stat_all_tables s on s.relid = c.oid
where n.nspname = 'pgflow' and c.relname = any($1::text[]) and c.relkind in ('r', 'p')`

// ReadStats reads the row counts of pgflow's tables from the statistics, in
// a READ ONLY transaction of its own with the audit's settings (budget and
// lock_timeout): catalog reads only. A count is reltuples; a table never
// analyzed or vacuumed (reltuples -1) falls back to n_live_tup. It errors when there is
// no pgflow.step_tasks.
func ReadStats(ctx context.Context, conn *pgx.Conn, budget, lockTimeout time.Duration) (Stats, error) {
	var st Stats
	tx, err := session.BeginReadOnly(ctx, conn, budget, lockTimeout, "pgflow-upgrade audit (forecast)")
	if err != nil {
		return st, fmt.Errorf("reading row counts from the statistics: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, statsSQL, statsTables)
	if err != nil {
		return st, fmt.Errorf("reading row counts from the statistics: %w", err)
	}
	found := false
	st.Source = SourceReltuples
	for rows.Next() {
		var name string
		var reltuples, live float64
		var analyzed *time.Time
		if err := rows.Scan(&name, &reltuples, &live, &analyzed); err != nil {
			return st, fmt.Errorf("reading row counts from the statistics: %w", err)
		}
		n, fromLive := estimateRows(reltuples, live)
		if p := st.count(name); p != nil {
			*p = n
		}
		if name == "step_tasks" {
			found = true
			if fromLive {
				st.Source = SourceLiveTup
			}
			if analyzed != nil {
				t := analyzed.UTC()
				st.LastAnalyzed = &t
			}
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("reading row counts from the statistics: %w", err)
	}
	if !found {
		return st, fmt.Errorf("no pgflow.step_tasks table: nothing to forecast")
	}
	return st, nil
}

// statsTables are the pgflow tables whose rows Stats counts.
var statsTables = []string{"step_tasks", "step_states", "runs", "workers", "worker_functions"}

// count is the field of Stats that holds table's rows (nil: not counted).
func (s *Stats) count(table string) *int64 {
	switch table {
	case "step_tasks":
		return &s.StepTasks
	case "step_states":
		return &s.StepStates
	case "runs":
		return &s.Runs
	case "workers":
		return &s.Workers
	case "worker_functions":
		return &s.WorkerFunctions
	}
	return nil
}

// estimateRows: reltuples, or n_live_tup when the table was never analyzed
// (reltuples -1; 0 with live rows before PostgreSQL 14).
func estimateRows(reltuples, live float64) (int64, bool) {
	if reltuples < 0 || (reltuples == 0 && live > 0) {
		return int64(live + 0.5), true
	}
	return int64(reltuples + 0.5), false
}
