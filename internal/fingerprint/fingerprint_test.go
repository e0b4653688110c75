package fingerprint_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// smallState builds a 0.16.0 state with a queued, a started, a completed
// (archived) task and a map fan-out, through the engine's own functions.
const smallState = `
select pgflow.create_flow('fp_flow', max_attempts => 3, base_delay => 0, timeout => 5);
select pgflow.add_step('fp_flow', 'first');
select pgflow.add_step('fp_flow', 'fan', array['first'], step_type => 'map');
select pgflow.create_flow('fp_other');
select pgflow.add_step('fp_other', 'only');
insert into pgflow.workers (worker_id, queue_name, function_name) values ('00000000-0000-0000-0000-0000000000a1', 'fp_flow', 'fn');
select pgflow.track_worker_function('fn');
select pgflow.start_flow('fp_flow', '{"n": 1}'::jsonb);
select pgflow.start_flow('fp_flow', '{"n": 2}'::jsonb);
select pgflow.start_flow('fp_other', '{"n": 3}'::jsonb);
-- start every first task of fp_flow, complete one of them with an array so
-- the map fans out.
select count(*) from pgflow.start_tasks('fp_flow',
  array(select msg_id from pgmq.read('fp_flow', 30, 10)), '00000000-0000-0000-0000-0000000000a1');
select count(*) from pgflow.complete_task(
  (select run_id from pgflow.runs where input = '{"n": 1}'), 'first', 0, '[1, 2, 3]'::jsonb);
`

func build(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	if _, err := db.Pool.Exec(context.Background(), smallState); err != nil {
		t.Fatalf("building the state: %v", err)
	}
	return db
}

// upgrade applies the embedded migrations in one transaction, with sabotage
// run inside it after the migration (a deliberately broken migration).
func upgrade(t *testing.T, pool *pgxpool.Pool, sabotage string) {
	t.Helper()
	if sabotage == "" {
		testdb.Migrate(t, pool)
		return
	}
	testdb.Migrate(t, pool, sabotage)
}

func take(t *testing.T, pool *pgxpool.Pool) *fingerprint.Fingerprint {
	t.Helper()
	fp, err := fingerprint.Take(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func TestTakeCoversEveryTableAndQueue(t *testing.T) {
	db := build(t)
	fp := take(t, db.Pool)
	for table, min := range map[string]int{
		"pgflow.flows": 2, "pgflow.steps": 3, "pgflow.deps": 1, "pgflow.runs": 3,
		"pgflow.step_states": 5, "pgflow.step_tasks": 6, "pgflow.workers": 1, "pgflow.worker_functions": 1,
		fingerprint.QueueList: 2, fingerprint.QueueTable("fp_flow"): 4, fingerprint.ArchiveTable("fp_flow"): 1,
		fingerprint.QueueTable("fp_other"): 1,
	} {
		if got := fp.Count(table); got < min {
			t.Errorf("%s: %d rows fingerprinted, want at least %d", table, got, min)
		}
	}
	if d := fingerprint.Compare(fp, take(t, db.Pool)); len(d) != 0 {
		t.Fatalf("two fingerprints of an unchanged database differ:\n%s", fingerprint.Format(d, 20))
	}
}

func TestCleanUpgradeSurvives(t *testing.T) {
	db := build(t)
	before := take(t, db.Pool)
	upgrade(t, db.Pool, "")
	after := take(t, db.Pool)
	if d := fingerprint.Compare(before, after); len(d) != 0 {
		t.Fatalf("the upgrade changed pre-existing state:\n%s", fingerprint.Format(d, 20))
	}
	d, err := fingerprint.CheckNewColumns(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 0 {
		t.Fatalf("new columns wrong:\n%s", fingerprint.Format(d, 20))
	}
}

// A deliberately broken migration: each sabotage must be caught and named.
func TestBrokenMigrationIsCaught(t *testing.T) {
	testdb.SkipIfShort(t, "a deliberately broken migration is caught")
	cases := []struct {
		name, sabotage string
		table, what    string
	}{
		{"drops a task row", `delete from pgflow.step_tasks where ctid = (select ctid from pgflow.step_tasks where status = 'queued' limit 1)`,
			"pgflow.step_tasks", fingerprint.RowMissing},
		{"drops a queue message", `select pgmq.delete('fp_other', (select max(msg_id) from pgmq.q_fp_other))`,
			fingerprint.QueueTable("fp_other"), fingerprint.RowMissing},
		{"drops an archived message", `delete from pgmq.a_fp_flow where msg_id = (select min(msg_id) from pgmq.a_fp_flow)`,
			fingerprint.ArchiveTable("fp_flow"), fingerprint.RowMissing},
		{"makes a message visible", `update pgmq.q_fp_flow set vt = vt - interval '1 hour' where msg_id = (select min(msg_id) from pgmq.q_fp_flow)`,
			fingerprint.QueueTable("fp_flow"), fingerprint.Changed},
		{"resets an attempt count", `update pgflow.step_tasks set attempts_count = 0 where status = 'started'`,
			"pgflow.step_tasks", fingerprint.Changed},
		{"drops a column", `alter table pgflow.runs drop column remaining_steps`,
			"pgflow.runs", fingerprint.ColumnMissing},
		{"drops a queue", `select pgmq.drop_queue('fp_other')`,
			fingerprint.QueueList, fingerprint.RowMissing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := build(t)
			before := take(t, db.Pool)
			upgrade(t, db.Pool, c.sabotage)
			diffs := fingerprint.Compare(before, take(t, db.Pool))
			found := false
			for _, d := range diffs {
				if d.Table == c.table && d.What == c.what {
					found = true
				}
			}
			if !found {
				t.Fatalf("sabotage %q not caught as %s in %s; diffs:\n%s", c.sabotage, c.what, c.table, fingerprint.Format(diffs, 20))
			}
			for _, d := range diffs {
				if d.Table == "" || d.What == "" || (d.What != fingerprint.TableMissing && d.What != fingerprint.ColumnMissing && d.Key == "") {
					t.Errorf("diff does not name table and key: %+v", d)
				}
			}
		})
	}
}

func TestCheckNewColumnsCatchesWrongValues(t *testing.T) {
	db := build(t)
	ctx := context.Background()
	d, err := fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 3 || d[0].What != fingerprint.ColumnMissing {
		t.Fatalf("before the upgrade: want the three columns reported missing, got %v", d)
	}
	// A task pointed at the other flow's queue (a valid name, so only this
	// check can see it).
	upgrade(t, db.Pool, `update pgflow.step_tasks set queue_name = 'fp_other'
	                      where ctid = (select ctid from pgflow.step_tasks where flow_slug = 'fp_flow' limit 1)`)
	d, err = fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 1 || d[0].Table != "pgflow.step_tasks" || d[0].What != fingerprint.WrongValue || !strings.Contains(d[0].String(), "fp_other") {
		t.Fatalf("want one wrong step_tasks.queue_name, got:\n%s", fingerprint.Format(d, 10))
	}
}
