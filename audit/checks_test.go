package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// oneFlow is a baseline with flow "f" (root step "a") and two started runs:
// two queued tasks, each with its message in pgmq.q_f.
func oneFlow(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	db.Exec(t,
		`select pgflow.create_flow('f')`,
		`select pgflow.add_step('f', 'a')`,
		`select pgflow.start_flow('f', '{}'::jsonb, '00000000-0000-4000-8000-000000000001')`,
		`select pgflow.start_flow('f', '{}'::jsonb, '00000000-0000-4000-8000-000000000002')`)
	return db
}

// inflight is a real 0.16.0 baseline in flight, driven through its own
// engine: two flows (a DAG and a map), started runs, tasks claimed by a
// registered worker with start_tasks, one completed; two live workers and
// a stopped one.
func inflight(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	db.Exec(t,
		`select pgflow.create_flow('alpha')`, `select pgflow.add_step('alpha', 'a')`, `select pgflow.add_step('alpha', 'b', array['a'])`,
		`select pgflow.create_flow('beta')`, `select pgflow.add_step('beta', 'items', step_type => 'map')`,
		`select pgflow.start_flow('alpha', '{"n": 1}'::jsonb)`, `select pgflow.start_flow('alpha', '{"n": 2}'::jsonb)`,
		`select pgflow.start_flow('beta', '[1, 2, 3]'::jsonb)`,
		`insert into pgflow.workers (worker_id, queue_name, function_name) values
		   ('00000000-0000-4000-8000-00000000aa01', 'alpha', 'alpha-worker'),
		   ('00000000-0000-4000-8000-00000000aa02', 'beta', 'beta-worker')`,
		`insert into pgflow.workers (worker_id, queue_name, function_name, stopped_at) values
		   ('00000000-0000-4000-8000-00000000aa03', 'alpha', 'old', now())`,
		`select pgflow.start_tasks('alpha', array(select msg_id from pgmq.read('alpha', 30, 10)), '00000000-0000-4000-8000-00000000aa01')`,
		`select pgflow.complete_task(t.run_id, t.step_slug, t.task_index, '{"ok": true}'::jsonb)
		   from pgflow.step_tasks t where t.flow_slug = 'alpha' and t.status = 'started' order by t.message_id limit 1`,
		`analyze`)
	var started int
	if err := db.Pool.QueryRow(context.Background(), `select count(*) from pgflow.step_tasks where status in ('started', 'completed')`).Scan(&started); err != nil || started != 2 {
		t.Fatalf("in-flight state: %d claimed tasks (%v), want 2", started, err)
	}
	return db
}

// fixtureInflight is the fixtures' real inflight state: runs, steps and
// tasks in every status, four live workers and a stopped one.
func fixtureInflight(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.PGMQ(t)
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), db.Pool); err != nil {
		t.Fatalf("loading inflight: %v", err)
	}
	return db
}

// blockerChecks are the checks that must be silent on a healthy database.
var blockerChecks = []string{"flows.case_alias", "steps.case_alias", "slugs.strict_rule", "flows.queue_name_too_long",
	"tasks.duplicate_message_id", "pgmq.unowned_queue", "pgmq.queue_case_spellings", "pgmq.flow_queue_missing", "pgmq.queue_physical"}

func TestHealthyDatabasesHaveNoBlockers(t *testing.T) {
	live := map[string]int64{"baseline+flow": 0, "inflight": 2, "fixture inflight": 4}
	for name, mk := range map[string]func(*testing.T) *testdb.DB{"baseline+flow": oneFlow, "inflight": inflight, "fixture inflight": fixtureInflight} {
		t.Run(name, func(t *testing.T) {
			db := mk(t)
			rep := runAudit(t, db, audit.Options{})
			if rep.Blockers() != 0 || rep.Errors() != 0 || rep.Inconclusive() != 0 {
				t.Fatalf("blockers %d, errors %d, inconclusive %d: %+v", rep.Blockers(), rep.Errors(), rep.Inconclusive(), rep.Checks)
			}
			if rep.Schema.State != versions.SchemaBaseline {
				t.Fatalf("schema state %s (%v), want baseline", rep.Schema.State, rep.Schema.Differences)
			}
			for _, id := range blockerChecks {
				mustBeOK(t, rep, id)
			}
			if n := len(audit.For(audit.InAudit, audit.EveryPlan)); len(rep.Checks) != n {
				t.Fatalf("%d results for %d checks", len(rep.Checks), n)
			}
			mustBeOK(t, rep, "sessions.locks_on_pgflow")
			mustBeOK(t, rep, "sessions.long_transactions")
			// Live 0.16.0 workers are counted; stopped ones are not.
			if live[name] > 0 {
				if f := mustFire(t, rep, "workers.legacy_alive", audit.Warning); f.Count != live[name] {
					t.Fatalf("live workers: %+v, want %d", f, live[name])
				}
			} else {
				mustBeOK(t, rep, "workers.legacy_alive")
			}
			if !rep.PGMQ.Installed || rep.ServerVersion == "" {
				t.Fatalf("report lacks server/pgmq facts: %+v %q", rep.PGMQ, rep.ServerVersion)
			}
		})
	}
}

func TestSchemaState(t *testing.T) {
	t.Run("partial", func(t *testing.T) {
		db := testdb.Baseline(t)
		db.Exec(t, `alter table pgflow.steps add column queue_name text`)
		rep := runAudit(t, db, audit.Options{Checks: []string{"schema.state"}})
		f := mustFire(t, rep, "schema.state", audit.Blocker)
		if rep.Schema.State != versions.SchemaPartial || !strings.Contains(f.Message, "column pgflow.steps.queue_name: extra") {
			t.Fatalf("state %s, message %q", rep.Schema.State, f.Message)
		}
	})
	t.Run("modified baseline", func(t *testing.T) {
		db := testdb.Baseline(t)
		db.Exec(t, `alter table pgflow.step_tasks alter column message_id type integer`)
		rep := runAudit(t, db, audit.Options{Checks: []string{"schema.state"}})
		f := mustFire(t, rep, "schema.state", audit.Blocker)
		if !strings.Contains(f.Message, "column pgflow.step_tasks.message_id: type differs: want bigint, got integer") {
			t.Fatalf("message %q", f.Message)
		}
	})
	t.Run("not pgflow", func(t *testing.T) {
		db := testdb.PGMQ(t)
		rep := runAudit(t, db, audit.Options{})
		mustFire(t, rep, "schema.state", audit.Blocker)
		if rep.Schema.State != versions.SchemaNotPgflow {
			t.Fatalf("state %s", rep.Schema.State)
		}
		// The checks that read pgflow tables are skipped, not errors.
		if r := result(t, rep, "tasks.duplicate_message_id"); r.Status != audit.StatusSkipped {
			t.Fatalf("duplicate check on a database without pgflow: %s %s", r.Status, r.Error)
		}
	})
	t.Run("upgraded", func(t *testing.T) {
		// Upstream's 0.17.0: the embedded migration run as a plain
		// transaction (the migration is another package's business; detection
		// compares with the one 0.17.0 description). No check has anything
		// to say then.
		db := oneFlow(t)
		all, err := migrations.All()
		if err != nil || len(all) == 0 {
			t.Fatalf("migrations: %v (%d files)", err, len(all))
		}
		for _, m := range all {
			db.Exec(t, m.SQL)
		}
		db.Exec(t, `insert into pgflow.workers (worker_id, queue_name, function_name) values ('00000000-0000-4000-8000-00000000cc01', 'f', 'new')`)
		rep := runAudit(t, db, audit.Options{})
		f := mustFire(t, rep, "schema.state", audit.Info)
		if rep.Schema.State != versions.SchemaUpgraded {
			t.Fatalf("state %s: %s", rep.Schema.State, f.Message)
		}
		if rep.Blockers() != 0 || rep.Errors() != 0 || rep.Inconclusive() != 0 {
			t.Fatalf("upgraded database: %d blockers, %d errors, %d inconclusive: %+v", rep.Blockers(), rep.Errors(), rep.Inconclusive(), rep.Checks)
		}
		// A live worker on 0.17.0 is not a 0.16.0 one.
		mustBeOK(t, rep, "workers.legacy_alive")
	})
}

func TestPGMQInstalled(t *testing.T) {
	rep := runAudit(t, testdb.Empty(t), audit.Options{Checks: []string{"pgmq.installed"}})
	if f := mustFire(t, rep, "pgmq.installed", audit.Blocker); !strings.Contains(f.Message, "not installed") {
		t.Fatalf("message %q", f.Message)
	}
	db := testdb.Baseline(t)
	rep = runAudit(t, db, audit.Options{Checks: []string{"pgmq.installed"}})
	mustFire(t, rep, "pgmq.installed", audit.Info)
	db.DetachFromExtension(t, "pgmq", `function pgmq.set_vt(text, bigint, integer)`)
	db.Exec(t, `drop function pgmq.set_vt(text, bigint, integer)`)
	rep = runAudit(t, db, audit.Options{Checks: []string{"pgmq.installed"}})
	if f := mustFire(t, rep, "pgmq.installed", audit.Blocker); !strings.Contains(f.Message, "pgmq.set_vt(text, bigint, integer)") {
		t.Fatalf("message %q", f.Message)
	}
}

func TestQueuePhysical(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `select pgflow.create_flow('g')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}}), "pgmq.queue_physical")
	db.DetachFromExtension(t, "pgmq", `sequence pgmq.q_g_msg_id_seq`, `table pgmq.a_g`)
	db.Exec(t,
		`alter table pgmq.a_g drop column headers`,
		`alter table pgmq.q_g alter column msg_id drop identity`,
		`alter table pgmq.q_f alter column message type text`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}, Sample: 10}), "pgmq.queue_physical", audit.Warning)
	if f.Count != 2 {
		t.Fatalf("count %d, want 2 queues: %+v", f.Count, f.Samples)
	}
	for _, want := range []string{"column headers is missing", "msg_id is not an identity column", "column message is text, expected jsonb"} {
		if !sampleHas(f, "problem", want) {
			t.Errorf("no problem %q in %+v", want, f.Samples)
		}
	}
	db.Exec(t, `drop table pgmq.a_g`)
	f = mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}, Sample: 10}), "pgmq.queue_physical", audit.Warning)
	if !sampleHas(f, "problem", "table is missing") || !sampleHas(f, "table", "pgmq.a_g") {
		t.Fatalf("%+v", f.Samples)
	}
}

func TestLegacyWorkers(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `insert into pgflow.workers (worker_id, queue_name, function_name, stopped_at)
	             values ('00000000-0000-4000-8000-00000000bb01', 'f', 'old', now())`,
		`insert into pgflow.workers (worker_id, queue_name, function_name, last_heartbeat_at)
	             values ('00000000-0000-4000-8000-00000000bb02', 'f', 'gone', now() - interval '1 hour')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"workers.legacy_alive"}}), "workers.legacy_alive")
	db.Exec(t, `insert into pgflow.workers (worker_id, queue_name, function_name)
	             values ('00000000-0000-4000-8000-00000000bb03', 'f', 'alive')`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"workers.legacy_alive"}}), "workers.legacy_alive", audit.Warning)
	if f.Count != 1 || !sampleHas(f, "worker_id", "00000000-0000-4000-8000-00000000bb03") {
		t.Fatalf("%+v", f)
	}
}

func TestLongTransactions(t *testing.T) {
	db := oneFlow(t)
	opts := audit.Options{Checks: []string{"sessions.long_transactions"}, LongTransaction: time.Hour, IdleInTransaction: time.Hour}
	mustBeOK(t, runAudit(t, db, opts), "sessions.long_transactions")

	other := testdb.Connect(t, db.DSN)
	ctx := context.Background()
	if _, err := other.Exec(ctx, `set application_name = 'h-idle-session'`); err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `select 1`); err != nil {
		t.Fatal(err)
	}
	// Thresholds of 1 ms: the session is idle in a transaction older than that.
	opts.LongTransaction, opts.IdleInTransaction = time.Millisecond, time.Millisecond
	f := mustFire(t, runAudit(t, db, opts), "sessions.long_transactions", audit.Warning)
	if !sampleHas(f, "application_name", "h-idle-session") || !sampleHas(f, "state", "idle in transaction") {
		t.Fatalf("%+v", f)
	}
}

func TestSizes(t *testing.T) {
	db := oneFlow(t)
	db.Exec(t, `analyze pgflow.step_tasks`)
	r := result(t, runAudit(t, db, audit.Options{Checks: []string{"size.tables"}, Sample: 20}), "size.tables")
	if r.Status != audit.StatusFindings || len(r.Findings) != 3 {
		t.Fatalf("%s %s %+v", r.Status, r.Error, r.Findings)
	}
	for _, f := range r.Findings {
		if f.Severity != audit.Info {
			t.Fatalf("size finding of severity %s", f.Severity)
		}
	}
	if !sampleHas(r.Findings[0], "table", "pgflow.step_tasks") || !sampleHas(r.Findings[1], "table", "pgmq.q_f") {
		t.Fatalf("%+v", r.Findings)
	}
	if bf := r.Findings[2]; bf.Count != 2 || !strings.Contains(bf.Message, "about 2 rows") {
		t.Fatalf("backfill estimate: %+v", bf)
	}
	// No pgflow: nothing to size.
	if r := result(t, runAudit(t, testdb.PGMQ(t), audit.Options{Checks: []string{"size.tables"}}), "size.tables"); r.Status != audit.StatusSkipped {
		t.Fatalf("without pgflow: %s", r.Status)
	}
}

func TestBackupWarning(t *testing.T) {
	db := oneFlow(t)
	ctx := context.Background()
	c, err := audit.Lookup("backup.pgdump_pgmq")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// A plain pgmq schema is dumped with the database: nothing to say.
	fs, err := c.Run(ctx, c, tx, audit.Env{Sample: 5, PGMQ: pgmqver.Found{Installed: true, Kind: "schema"}})
	if err != nil || len(fs) != 0 {
		t.Fatalf("schema pgmq: %v %+v", err, fs)
	}
	// As an extension 1.5.1, pg_dump leaves the queues out: the count is
	// the queues whose tables pg_depend shows as extension members (none
	// on the stand-in, whose pgmq.meta is not marked for pg_dump either).
	fs, err = c.Run(ctx, c, tx, audit.Env{Sample: 5, PGMQ: pgmqver.Found{Installed: true, Kind: "extension", Version: "1.5.1"}})
	members := int64(0)
	if testdb.PGMQKindInUse() == "extension" {
		members = 1
	}
	if err != nil || len(fs) != 1 || fs[0].Severity != audit.Warning || fs[0].Count != members || !strings.Contains(fs[0].Message, "pg_dump") {
		t.Fatalf("extension pgmq: %v %+v", err, fs)
	}
	// What the live database has, through the runner.
	rep := runAudit(t, db, audit.Options{Checks: []string{"backup.pgdump_pgmq"}})
	if rep.PGMQ.Kind == "extension" {
		mustFire(t, rep, "backup.pgdump_pgmq", audit.Warning)
	} else {
		mustBeOK(t, rep, "backup.pgdump_pgmq")
	}
	// Unlogged queues are also missing from physical backups.
	db.Exec(t, `select pgflow.create_flow('u')`, `select pgmq.drop_queue('u')`, `select pgmq.create_unlogged('u')`)
	rep = runAudit(t, db, audit.Options{Checks: []string{"backup.pgdump_pgmq"}})
	found := false
	for _, f := range fired(t, rep, "backup.pgdump_pgmq", audit.Warning) {
		if strings.Contains(f.Message, "unlogged") && sampleHas(f, "queue", "u") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no unlogged-queue warning: %+v", result(t, rep, "backup.pgdump_pgmq"))
	}
}

// TestSizesNeverAnalysed: a queue holding 93 messages whose table was
// never analysed (reltuples -1) is counted, not summed as 0: before, the
// finding read "about 0 messages". A database without queue tables gets
// no finding about them (before: "0 pgmq queue tables, 0 B in total,
// about 0 messages").
func TestSizesNeverAnalysed(t *testing.T) {
	db := testdb.Baseline(t)
	if r := result(t, runAudit(t, db, audit.Options{Checks: []string{"size.tables"}}), "size.tables"); len(r.Findings) != 2 ||
		strings.Contains(r.Findings[0].Message+r.Findings[1].Message, "queue tables") {
		t.Fatalf("without queues: %+v", r.Findings)
	}
	db.Exec(t, `select pgflow.create_flow('never_analysed')`,
		`alter table pgmq.q_never_analysed set (autovacuum_enabled = false)`, `alter table pgmq.a_never_analysed set (autovacuum_enabled = false)`,
		`select pgmq.send_batch('never_analysed', array(select '{}'::jsonb from generate_series(1, 93)))`)
	var reltuples float64
	if err := db.Pool.QueryRow(context.Background(), `select reltuples from pg_class where oid = 'pgmq.q_never_analysed'::regclass`).Scan(&reltuples); err != nil || reltuples >= 0 {
		t.Fatalf("the queue table's reltuples: %v (%v), want -1 (never analysed)", reltuples, err)
	}
	r := result(t, runAudit(t, db, audit.Options{Checks: []string{"size.tables"}}), "size.tables")
	var msg string
	for _, f := range r.Findings {
		if strings.Contains(f.Message, "pgmq queue tables") {
			msg = f.Message
		}
	}
	if !strings.Contains(msg, "93 messages (counted: the tables were never analysed)") || strings.Contains(msg, "about 0") {
		t.Fatalf("queue tables never analysed: %q", msg)
	}
	db.Exec(t, `analyze pgmq.q_never_analysed`, `analyze pgmq.a_never_analysed`)
	r = result(t, runAudit(t, db, audit.Options{Checks: []string{"size.tables"}}), "size.tables")
	for _, f := range r.Findings {
		if strings.Contains(f.Message, "pgmq queue tables") && !strings.Contains(f.Message, "about 93 messages (estimates as of the last ANALYZE)") {
			t.Fatalf("analysed: %q", f.Message)
		}
	}
}
