package upgrade_tests

import (
	"context"
	"reflect"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// A force-skip cascade broadcasts step:skipped in dependency order (the
// skipped step, then what depends on it, then what depends on that) on a
// populated, analysed database, whichever plan and path took it to either
// destination.
//
// At 0.17.0 (--to 0.17.0: this tool's own hop) the order is guaranteed
// whatever the slugs: the chain's slugs run against dependency order
// (zeta -> yota -> xi), and upstream's own 0.17.0, the control, reports
// them in another order. At upstream's newest the function is upstream's
// own text, which drives the cascade in slug order: the chain is the one
// upstream's own test asserts on, whose slugs sort in dependency order
// (step_a -> step_b -> step_c); docs/upstream-notes.md says where slug
// and dependency order part.
func TestForceSkipBroadcastOrderOnEveryPlan(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	copyDir := testdb.PgflowInstalledCopy(t, 27)
	reversed := []string{"zeta", "yota", "xi"}
	sorted := []string{"step_a", "step_b", "step_c"}

	control := skipOrder(t, testdb.Upstream(t, "0.17.0"), reversed)
	if reflect.DeepEqual(control, skippedEvents(reversed)) {
		t.Fatalf("upstream's own 0.17.0 gave dependency order %v: this test would not tell this tool's hop from upstream's", control)
	}
	t.Logf("control, upstream's own 0.17.0: %v", control)

	for _, c := range []struct {
		name, from, to string
		online         bool
		chain          []string
	}{
		{"0.16.0 to 0.17.0 by apply", "0.16.0", versions.R0_17_0, false, reversed},
		{"0.16.0 to 0.17.0 by apply --online", "0.16.0", versions.R0_17_0, true, reversed},
		{"0.14.1 to 0.17.0 by apply", "0.14.1", versions.R0_17_0, false, reversed},
		{"0.16.0 to the newest by apply", "0.16.0", versions.Newest, false, sorted},
		{"0.16.0 to the newest by apply --online", "0.16.0", versions.Newest, true, sorted},
		{"0.14.1 to the newest by apply", "0.14.1", versions.Newest, false, sorted},
		{"0.17.0 to the newest by apply", "0.17.0", versions.Newest, false, sorted},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Upstream(t, c.from)
			opts := upgrade.Options{PgflowMigrations: copyDir, To: c.to}
			var reached string
			if c.online {
				res, err := online.Upgrade(ctx, testdb.Connect(t, db.DSN), online.Options{Switch: opts})
				if err != nil || res.Outcome != outcome.Applied || res.Report.Switch == nil {
					t.Fatalf("apply --online: %v (%s: %s)", err, res.Outcome, res.Message)
				}
				reached = res.Report.Switch.Report.VersionNow
			} else {
				res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
				if err != nil || res.Outcome != outcome.Applied {
					t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
				}
				reached = res.Report.VersionNow
			}
			if reached != c.to {
				t.Fatalf("reached %s, want %s", reached, c.to)
			}
			if got := skipOrder(t, db, c.chain); !reflect.DeepEqual(got, skippedEvents(c.chain)) {
				t.Fatalf("step:skipped events %v, want dependency order %v", got, skippedEvents(c.chain))
			}
		})
	}
}

func skippedEvents(chain []string) []string {
	var out []string
	for _, s := range chain {
		out = append(out, "step:"+s+":skipped")
	}
	return out
}

// skipOrder builds the chain (each step depending on the one before), starts
// one run of it among 300 others (statistics gathered, so the planner reads
// the run's step_states as a populated database does), force-skips its
// first step and returns the run's step:skipped events in the order they
// were recorded.
func skipOrder(t *testing.T, db *testdb.DB, chain []string) []string {
	t.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) { t.Helper(); testdb.Exec(t, db.Pool, sql, args...) }
	exec(`select pgflow.create_flow('chain')`)
	for i, s := range chain {
		if i == 0 {
			exec(`select pgflow.add_step('chain', $1)`, s)
			continue
		}
		exec(`select pgflow.add_step('chain', $1, array[$2])`, s, chain[i-1])
	}
	var run string
	if err := db.Pool.QueryRow(ctx, `select run_id::text from pgflow.start_flow('chain', '{}')`).Scan(&run); err != nil {
		t.Fatal(err)
	}
	exec(`select count(*) from generate_series(1, 300) i, pgflow.start_flow('chain', '{}')`)
	exec(`analyze pgflow.step_states; analyze pgflow.steps; analyze pgflow.deps; analyze pgflow.runs`)
	exec(`select pgflow._cascade_force_skip_steps($1::uuid, $2, 'condition_unmet')`, run, chain[0])
	var events []string
	if err := db.Pool.QueryRow(ctx, `select coalesce(array_agg(b.event order by b.id), '{}') from realtime.recorded_broadcasts b
		where b.topic = 'pgflow:run:' || $1 and b.event like 'step:%:skipped'`, run).Scan(&events); err != nil {
		t.Fatal(err)
	}
	return events
}
