package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// The upgraded real 0.16.0 baseline has exactly upstream's 0.17.0 catalog.
func TestUpgradedCatalogIsUpstream017(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 3)
	applyMigration(t, db.Pool)

	want, err := upgrade.Want017()
	if err != nil {
		t.Fatal(err)
	}
	got, err := catalog.Read(ctx, db.Pool, "pgflow")
	if err != nil {
		t.Fatal(err)
	}
	// The pgmq version depends on the test server (extension or stand-in).
	got.PGMQ = want.PGMQ
	if d := catalog.Diff(want, got); len(d) > 0 {
		t.Fatalf("the upgraded catalog differs from pgflow 0.17.0:\n  %s", strings.Join(catalog.Strings(d), "\n  "))
	}
	// Nothing of ours in schema pgflow, nothing of the fork anywhere.
	if n := scalar[int](t, db.Pool, `select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
		where n.nspname = 'pgflow' and p.proname in ('claim_tasks', 'queue_protocol_version', 'release_task')`); n != 0 {
		t.Fatalf("%d fork functions in schema pgflow", n)
	}
	if scalar[bool](t, db.Pool, `select to_regclass('pgflow.schema_revisions') is not null`) {
		t.Fatal("pgflow.schema_revisions exists: bookkeeping belongs in pgflow_upgrade")
	}
}

// Existing rows keep every value; the new columns hold lower(flow_slug)
// and queue_mode 'flow'; no queue is created, moved or renamed.
func TestBackfillKeepsRowsAndQueues(t *testing.T) {
	db := testdb.Inflight(t, 3)
	rows := `select md5(concat_ws('|',
		(select string_agg(format('%s|%s|%s|%s|%s|%s', run_id, step_slug, task_index, status, message_id, attempts_count), ',' order by run_id, step_slug, task_index) from pgflow.step_tasks),
		(select string_agg(format('%s|%s|%s', flow_slug, step_slug, step_index), ',' order by 1) from pgflow.steps),
		(select string_agg(format('%s|%s|%s', flow_slug, opt_max_attempts, opt_timeout), ',' order by 1) from pgflow.flows),
		(select string_agg(queue_name::text, ',' order by 1) from pgmq.list_queues())))`
	before := scalar[string](t, db.Pool, rows)
	applyMigration(t, db.Pool)
	if after := scalar[string](t, db.Pool, rows); after != before {
		t.Fatal("pre-existing rows or queues changed")
	}
	if n := scalar[int](t, db.Pool, `select count(*) from pgflow.step_tasks where queue_name is distinct from lower(flow_slug)`); n != 0 {
		t.Fatalf("%d tasks with queue_name other than lower(flow_slug)", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*) from pgflow.steps where queue_name is distinct from lower(flow_slug)`); n != 0 {
		t.Fatalf("%d steps with queue_name other than lower(flow_slug)", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*) from pgflow.flows where queue_mode <> 'flow'`); n != 0 {
		t.Fatalf("%d flows not in flow mode", n)
	}
	if n := scalar[int](t, db.Pool, `select count(*) from pgflow.step_tasks`); n < 4 {
		t.Fatalf("only %d tasks: the state is too small to prove the backfill", n)
	}
}

// Every data condition that makes the 0.17.0 change fail makes the file
// fail as a whole: the database is left exactly as it was.
func TestRefusedAtomically(t *testing.T) {
	cases := []struct {
		name, setup, code string
	}{
		{"flows differing only by case", `
			insert into pgflow.flows (flow_slug) values ('Orders'), ('orders')`, "23505"},
		{"steps of one flow differing only by case", `
			insert into pgflow.flows (flow_slug) values ('shop');
			insert into pgflow.steps (flow_slug, step_slug, step_index) values ('shop', 'Pay', 0), ('shop', 'pay', 1)`, "23505"},
		{"slug starting with an underscore", `
			insert into pgflow.flows (flow_slug) values ('_hidden')`, "23514"},
		{"slug ending with an underscore", `
			insert into pgflow.flows (flow_slug) values ('ok');
			insert into pgflow.steps (flow_slug, step_slug) values ('ok', 'step_')`, "23514"},
		{"slug with a double underscore", `
			insert into pgflow.flows (flow_slug) values ('a__b')`, "23514"},
		{"lower(flow_slug) over 47 characters", `
			insert into pgflow.flows (flow_slug) values ('f` + strings.Repeat("x", 47) + `');
			insert into pgflow.steps (flow_slug, step_slug) values ('f` + strings.Repeat("x", 47) + `', 'only')`, "23514"},
		{"duplicate (lower(flow_slug), message_id)", `
			select pgflow.create_flow('dups');
			select pgflow.add_step('dups', 'a');
			select pgflow.start_flow('dups', '{}');
			select pgflow.start_flow('dups', '{}');
			update pgflow.step_tasks set message_id = 1 where flow_slug = 'dups'`, "23505"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := testdb.Baseline(t)
			testdb.Exec(t, db.Pool, c.setup)
			before := fingerprint(t, db.Pool)
			err := tryMigration(t, db.Pool)
			if err == nil {
				t.Fatal("the migration ran on data 0.17.0 refuses")
			}
			if got := pgCode(err); got != c.code {
				t.Fatalf("SQLSTATE %s (%v), want %s", got, err, c.code)
			}
			if after := fingerprint(t, db.Pool); after != before {
				t.Fatal("the database changed although the migration failed")
			}
		})
	}
}

// A second run of the file on 0.17.0 refuses at its guard and changes nothing.
func TestFileRefusesAnUpgradedDatabase(t *testing.T) {
	db := testdb.Baseline(t)
	applyMigration(t, db.Pool)
	before := fingerprint(t, db.Pool)
	err := tryMigration(t, db.Pool)
	if err == nil || !strings.Contains(err.Error(), "not a 0.16.0 database") {
		t.Fatalf("second run: %v, want the guard's refusal", err)
	}
	if fingerprint(t, db.Pool) != before {
		t.Fatal("the refused rerun changed the database")
	}
}
