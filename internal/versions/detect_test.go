package versions_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb/versiontest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Each known version, built from its description, is detected as itself,
// and the built catalog is the description (the builder is exact).
func TestDetectEachKnownVersion(t *testing.T) {
	for _, v := range versions.All() {
		t.Run(v.Name, func(t *testing.T) {
			t.Parallel()
			db := versiontest.DB(t, v)
			ctx := context.Background()
			got, err := catalog.Read(ctx, db.Pool, "pgflow")
			if err != nil {
				t.Fatal(err)
			}
			d := catalog.Diff(v.Catalog, got)
			d = slices.DeleteFunc(d, func(x catalog.Difference) bool { return x.Kind == catalog.KindPGMQ })
			if len(d) != 0 {
				t.Fatalf("built catalog differs from the description:\n%s", strings.Join(catalog.Strings(d), "\n"))
			}
			det, err := versions.Detect(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if det.Found != v.Name || det.State != v.State || !det.Exact || det.Version != v || len(det.Differences) != 0 {
				t.Fatalf("detected %+v", det)
			}
			switch v.State {
			case versions.StateOlder:
				// On the road: apply runs upstream's files up to 0.16.0 first.
				if !det.PlanStarts() || !strings.Contains(det.NextStep, "then `pgflow-upgrade apply --pgflow-migrations DIR`") {
					t.Errorf("next step %q", det.NextStep)
				}
			case versions.StateReady:
				if !strings.Contains(det.NextStep, "pgflow-upgrade audit`, then `pgflow-upgrade apply") {
					t.Errorf("next step %q", det.NextStep)
				}
			case versions.StateUpgraded:
				// Not upstream's newest release: the next step names it.
				if det.Release == nil || !strings.Contains(det.NextStep, "upstream's newest release is "+versions.Newest) ||
					!strings.Contains(det.NextStep, "pgflow-upgrade apply --pgflow-migrations") {
					t.Errorf("next step %q (release %+v)", det.NextStep, det.Release)
				}
			}
		})
	}
}

// What users add is tolerated: the version is still found, the additions listed.
func TestDetectToleratesUserAdditions(t *testing.T) {
	for _, name := range []string{"0.16.0", "0.17.1+"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := versiontest.DB(t, versions.MustLookup(name))
			ctx := context.Background()
			role := pgprovider.RandomName("versions_reader")
			if _, err := db.Pool.Exec(ctx, `
				create index my_runs_by_input on pgflow.runs ((input->>'customer'));
				alter table pgflow.runs add constraint my_input_is_object check (jsonb_typeof(input) = 'object') not valid;
				create role `+role+`;
				grant usage on schema pgflow to `+role+`;
				grant select on all tables in schema pgflow to `+role+`;
				alter table pgflow.flows enable row level security;
				create policy everyone on pgflow.flows using (true);
				create schema app;
				create function app.start_flow(text) returns void language sql as $$ select $$;
				create function pgflow.my_helper() returns int language sql as $$ select 1 $$;
			`); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				db.Pool.Exec(context.Background(), `drop owned by `+role+`; drop role `+role)
			})
			det, err := versions.Detect(ctx, db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if det.Found != name || det.Exact || len(det.Differences) != 0 {
				t.Fatalf("detected %s (exact %v): %v", det.Found, det.Exact, det.DifferenceStrings())
			}
			got := catalog.Strings(det.Additions)
			want := []string{
				"constraint my_input_is_object on pgflow.runs: extra (not in the description)",
				"index my_runs_by_input on pgflow.runs: extra (not in the description)",
				"function pgflow.my_helper(): extra (not in the description)",
			}
			if !slices.Equal(got, want) {
				t.Fatalf("additions %q, want %q", got, want)
			}
		})
	}
}

// A required object that is missing or altered is named exactly.
func TestDetectNamesWhatDiffers(t *testing.T) {
	db := versiontest.DB(t, versions.MustLookup("0.16.0"))
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		drop function pgflow.start_tasks(text, bigint[], uuid);
		drop index pgflow.idx_step_tasks_queued_msg;
		create index idx_step_tasks_queued_msg on pgflow.step_tasks (message_id);
	`); err != nil {
		t.Fatal(err)
	}
	det, err := versions.Detect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"index idx_step_tasks_queued_msg on pgflow.step_tasks: definition differs: want CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (message_id) WHERE (status = 'queued'::text), got CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (message_id)",
		"function pgflow.start_tasks(text, bigint[], uuid): missing",
	}
	if det.State != versions.StateUnknown || det.Found != "" || det.Closest != "0.16.0" || !slices.Equal(det.DifferenceStrings(), want) {
		t.Fatalf("detected %s/%s closest %s:\n%s", det.State, det.Found, det.Closest, strings.Join(det.DifferenceStrings(), "\n"))
	}
	if !strings.Contains(det.NextStep, "closest is 0.16.0") {
		t.Errorf("next step %q", det.NextStep)
	}
}

// Half of the 0.17.0 change (a nullable queue_name column) is neither
// version: it is the shape of an online upgrade in its backfill, named as
// such with its phase, what differs from 0.16.0 still listed.
func TestDetectHalfUpgraded(t *testing.T) {
	db := versiontest.DB(t, versions.MustLookup("0.16.0"))
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `alter table pgflow.step_tasks add column queue_name text`); err != nil {
		t.Fatal(err)
	}
	det, err := versions.Detect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if det.State != versions.StateOnline || det.Closest != "0.16.0" || len(det.Differences) != 1 ||
		det.Differences[0].Kind != catalog.KindColumn || det.Differences[0].Change != catalog.ChangeExtra || det.Differences[0].Name != "queue_name" {
		t.Fatalf("detected %s closest %s: %v", det.State, det.Closest, det.DifferenceStrings())
	}
	if det.Online == nil || det.Online.Phase != "backfill" || !strings.Contains(det.NextStep, "pgflow-upgrade apply --online") ||
		!strings.Contains(det.NextStep, "pgflow-upgrade apply --rollback-online") || strings.Contains(det.NextStep, "restore those objects") {
		t.Fatalf("online: %s %+v %q", det.State, det.Online, det.NextStep)
	}
	// Without it, the same schema is 0.16.0 again.
	if _, err := db.Pool.Exec(ctx, `alter table pgflow.step_tasks drop column queue_name`); err != nil {
		t.Fatal(err)
	}
	if det, err = versions.Detect(ctx, db.Pool); err != nil || det.State != versions.StateReady || det.Online != nil {
		t.Fatalf("after dropping the column: %v %+v", err, det)
	}
}

// Only the progress table of an online upgrade (killed in its expand,
// before the columns): 0.16.0 by its catalog, and yet an online upgrade in
// progress, which plain apply must not build on.
func TestDetectOnlineExpand(t *testing.T) {
	db := versiontest.DB(t, versions.MustLookup("0.16.0"))
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `create schema pgflow_upgrade; create table pgflow_upgrade.online_progress (id int)`); err != nil {
		t.Fatal(err)
	}
	det, err := versions.Detect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if det.State != versions.StateOnline || det.Found != "0.16.0" || det.Online == nil || det.Online.Phase != "expand" {
		t.Fatalf("detected %s found %q online %+v", det.State, det.Found, det.Online)
	}
}

func TestDetectNotPgflow(t *testing.T) {
	db := testdb.PGMQ(t)
	det, err := versions.Detect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if det.State != versions.StateNotPgflow || det.Found != "" || det.Catalog != nil {
		t.Fatalf("detected %+v", det)
	}
	db2 := testdb.Empty(t)
	if _, err := db2.Pool.Exec(context.Background(), `create schema pgflow; create table pgflow.mine (x int)`); err != nil {
		t.Fatal(err)
	}
	det, err = versions.Detect(context.Background(), db2.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if det.State != versions.StateUnknown || det.Closest == "" || len(det.Differences) == 0 {
		t.Fatalf("schema pgflow with a stranger's table: %+v", det)
	}
}

// The fixtures' baseline is recognised as ready: the real 0.16.0.
func TestDetectFixtureBaseline(t *testing.T) {
	db := testdb.Baseline(t)
	det, err := versions.Detect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if det.State != versions.StateReady || det.Found != versions.V0_16_0 {
		t.Fatalf("baseline detected as %s/%s: %v", det.State, det.Found, det.DifferenceStrings())
	}
}

// While another session holds a pgflow table ACCESS EXCLUSIVE, detection
// does not wait past the lock timeout: it compares definitions by name.
func TestDetectWhileATableIsLocked(t *testing.T) {
	db := versiontest.DB(t, versions.MustLookup("0.16.0"))
	ctx := context.Background()
	locker, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `lock table pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `set local lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.Read(ctx, tx, "pgflow"); !catalog.IsLockTimeout(err) {
		t.Fatalf("Read while step_tasks is locked: %v, want a lock timeout", err)
	}
	det, err := versions.Detect(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if det.Found != "0.16.0" || !det.Shallow || !strings.Contains(det.Summary(), "compared by name only") {
		t.Fatalf("detected %s shallow %v: %v", det.Found, det.Shallow, det.DifferenceStrings())
	}
	// Shallow, a missing index is still named.
	tx.Rollback(ctx)
	locker.Rollback(ctx)
	if _, err := db.Pool.Exec(ctx, `drop index pgflow.idx_step_tasks_queued_msg`); err != nil {
		t.Fatal(err)
	}
	sc, err := catalog.ReadShallow(ctx, db.Pool, "pgflow")
	if err != nil {
		t.Fatal(err)
	}
	m := catalog.Strings(catalog.Missing(versions.MustLookup("0.16.0").Catalog, sc))
	if want := []string{"index idx_step_tasks_queued_msg on pgflow.step_tasks: missing"}; !slices.Equal(m, want) {
		t.Fatalf("shallow Missing %q, want %q", m, want)
	}
}
