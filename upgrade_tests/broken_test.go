package upgrade_tests

import (
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// brokenUpgrade is apply with a migration that also runs sabotage: a
// deliberately broken migration the scenarios must catch.
func brokenUpgrade(sabotage string) scenario.UpgradeFunc {
	return func(ctx context.Context, db *scenario.DB) (*outcome.Result[*upgrade.Report], error) {
		return scenario.RunApplyWith(ctx, db, upgrade.Options{
			Verify: func() error { return nil }, // the sabotaged file is not in atlas.sum, by design
			Migrations: func() ([]migrations.Migration, error) {
				all, err := migrations.All()
				if err != nil {
					return nil, err
				}
				all[len(all)-1].SQL += "\n" + sabotage + "\n"
				return all, nil
			},
		})
	}
}

// TestBrokenMigrationIsCaught: a migration that drops one task row, or one
// queue message, passes apply's own checks; the survival check of the
// scenarios must catch it and name what is missing.
func TestBrokenMigrationIsCaught(t *testing.T) {
	testdb.SkipIfShort(t, "the survival check catches a migration that drops a task row or a message")
	cases := []struct {
		name, sabotage, want string
	}{
		{"drops a task row",
			`delete from pgflow.step_tasks where ctid = (select ctid from pgflow.step_tasks order by run_id, step_slug, task_index limit 1);`,
			"pgflow.step_tasks"},
		{"drops a queue message", `do $$
declare q text; n bigint;
begin
  -- The first queue (by name) that holds a message loses its lowest one.
  for q in select m.queue_name from pgmq.list_queues() m order by m.queue_name loop
    execute format('delete from pgmq.%I where msg_id = (select min(msg_id) from pgmq.%I)', 'q_' || lower(q), 'q_' || lower(q));
    get diagnostics n = row_count;
    exit when n > 0;
  end loop;
end
$$;`, "pgmq queue "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := &scenario.Runner{Server: testdb.Server(t), Upgrade: brokenUpgrade(c.sabotage), Parallel: 2}
			t.Cleanup(func() { _ = r.Close() })
			all, err := scenario.Select(scenario.Builtin(), []string{"clean-upgrade", "state-survival"})
			if err != nil {
				t.Fatal(err)
			}
			for _, res := range r.Run(context.Background(), all) {
				if res.Passed {
					t.Errorf("scenario %s passed with a broken migration that %s", res.Name, c.name)
					continue
				}
				if !strings.Contains(res.Error, fingerprint.RowMissing) || !strings.Contains(res.Error, c.want) {
					t.Errorf("scenario %s failed, but not with a %q diff in %s:\n%s", res.Name, fingerprint.RowMissing, c.want, res.Error)
				}
			}
		})
	}
}

// TestBrokenRealtimeIsCaught: an upgrade that broadcasts on its own, or
// that changes how the engine behaves afterwards (here a flow's retry
// budget), fails the realtime-events scenario, which names the difference.
func TestBrokenRealtimeIsCaught(t *testing.T) {
	testdb.SkipIfShort(t, "the realtime-events scenario catches an upgrade that broadcasts or changes the engine")
	cases := []struct {
		name, sabotage, want string
	}{
		{"broadcasts during the upgrade",
			`select realtime.send('{"event_type": "run:started"}'::jsonb, 'run:started', 'pgflow:run:x', false);`,
			"the upgrade itself broadcast 1 events"},
		{"changes a flow's retries",
			`update pgflow.flows set opt_max_attempts = 1 where flow_slug = 'rt_retry';`,
			"differs after the upgrade"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := &scenario.Runner{Server: testdb.Server(t), Upgrade: brokenUpgrade(c.sabotage), Parallel: 1}
			t.Cleanup(func() { _ = r.Close() })
			all, err := scenario.Select(scenario.Builtin(), []string{"realtime-events"})
			if err != nil {
				t.Fatal(err)
			}
			res := r.Run(context.Background(), all)[0]
			if res.Passed || !strings.Contains(res.Error, c.want) {
				t.Fatalf("realtime-events with a migration that %s: passed=%t, want a failure with %q:\n%s", c.name, res.Passed, c.want, res.Error)
			}
		})
	}
}
