package forecast_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestReadStats: counts are the statistics' (reltuples, or n_live_tup for
// a table never analyzed), read without waiting behind an ACCESS
// EXCLUSIVE lock on step_tasks (no lock on pgflow's tables).
func TestReadStats(t *testing.T) {
	db := testdb.Baseline(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		update pg_catalog.pg_class set reltuples = case relname when 'step_tasks' then 1234567 when 'step_states' then 890 else -1 end
		where relnamespace = 'pgflow'::regnamespace and relname in ('step_tasks', 'step_states', 'runs')`); err != nil {
		t.Fatal(err)
	}
	var runsLive int64
	if err := db.Pool.QueryRow(ctx, `select n_live_tup from pg_catalog.pg_stat_all_tables where relid = 'pgflow.runs'::regclass`).Scan(&runsLive); err != nil {
		t.Fatal(err)
	}
	// Someone holds step_tasks as an apply would.
	release := db.HoldLock(t, `lock table pgflow.step_tasks in access exclusive mode`)
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(ctx)
	st, err := forecast.ReadStats(ctx, conn, 5*time.Second, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if st.StepTasks != 1234567 || st.StepStates != 890 || st.Runs != runsLive || st.Source != forecast.SourceReltuples {
		t.Fatalf("stats %+v, want 1234567, 890, %d (n_live_tup of runs)", st, runsLive)
	}
	// step_tasks never analyzed: n_live_tup, and the source says so.
	release()
	if _, err := db.Pool.Exec(ctx, `update pg_catalog.pg_class set reltuples = -1 where oid = 'pgflow.step_tasks'::regclass`); err != nil {
		t.Fatal(err)
	}
	if st, err = forecast.ReadStats(ctx, conn, 5*time.Second, 200*time.Millisecond); err != nil || st.Source != forecast.SourceLiveTup {
		t.Fatalf("never analyzed: %+v, %v", st, err)
	}
}

// TestReadStatsWithoutPgflow: no step_tasks is an error (the audit reports
// the forecast unavailable).
func TestReadStatsWithoutPgflow(t *testing.T) {
	db := testdb.Empty(t)
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(context.Background())
	if _, err := forecast.ReadStats(context.Background(), conn, 5*time.Second, time.Second); err == nil {
		t.Fatal("no error without pgflow.step_tasks")
	}
}
