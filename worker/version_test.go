package worker_test

import (
	"context"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// On upstream's own 0.17.1 the worker records its pgflow_version at
// registration, as upstream's 0.17.1 worker does; on upstream's own 0.17.0
// (no such column) it registers without it. It runs a task on both.
func TestWorkerRecordsPgflowVersion(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	for release, want := range map[string]string{"0.17.0": "", "0.17.1": worker.PgflowVersion} {
		t.Run(release, func(t *testing.T) {
			db := testdb.Upstream(t, release)
			ctx := context.Background()
			ev := newEvents()
			cfg := greetConfig("greet")
			cfg.Logger, cfg.OnResult = testLogger(t), ev.onResult
			w, err := worker.New(db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(ctx); err != nil {
				t.Fatalf("Start on upstream's %s: %v", release, err)
			}
			defer w.Stop(ctx)
			var got string
			if err := db.Pool.QueryRow(ctx, `select coalesce(to_jsonb(w)->>'pgflow_version', '') from pgflow.workers w where worker_id = $1::uuid`,
				w.ID()).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("pgflow_version %q, want %q", got, want)
			}
			if _, err := db.Pool.Exec(ctx, `select pgflow.start_flow('greet', '{}'::jsonb)`); err != nil {
				t.Fatal(err)
			}
			ev.waitUntil(t, "the task done", func() bool { return w.Stats().Completed == 1 })
		})
	}
}
