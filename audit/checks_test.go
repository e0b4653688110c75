package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// oneFlow is a baseline with flow "f" (root step "a") and two started runs:
// two queued tasks, each with its message in pgmq.q_f.
func oneFlow(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Model(t)
	exec(t, db,
		`select pgflow.create_flow('f')`,
		`select pgflow.add_step('f', 'a')`,
		`select pgflow.start_flow('f', '{}'::jsonb, '00000000-0000-4000-8000-000000000001')`,
		`select pgflow.start_flow('f', '{}'::jsonb, '00000000-0000-4000-8000-000000000002')`)
	return db
}

// inflight is a fresh database with the fixtures' inflight state: runs,
// steps and tasks in every status, one live worker per flow.
func inflight(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.PGMQ(t)
	st, err := fixtures.LookupModel("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), db.Pool); err != nil {
		t.Fatalf("loading inflight: %v", err)
	}
	return db
}

// blockerChecks are the checks that must be silent on a healthy database.
var blockerChecks = []string{"pgmq.flow_queue_missing", "pgmq.queue_physical", "flows.case_alias",
	"tasks.duplicate_message_id", "tasks.message_missing", "queue.orphan_message", "queue.envelope_contradiction"}

func TestHealthyDatabasesHaveNoBlockers(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) *testdb.DB{"baseline+flow": oneFlow, "inflight": inflight} {
		t.Run(name, func(t *testing.T) {
			db := mk(t)
			rep := runAudit(t, db, audit.Options{})
			if rep.Blockers() != 0 || rep.Errors() != 0 || rep.Inconclusive() != 0 {
				t.Fatalf("blockers %d, errors %d, inconclusive %d: %+v", rep.Blockers(), rep.Errors(), rep.Inconclusive(), rep.Checks)
			}
			if rep.Schema.State != audit.StateBaseline {
				t.Fatalf("schema state %s (%v), want baseline", rep.Schema.State, rep.Schema.Differences)
			}
			for _, id := range blockerChecks {
				mustBeOK(t, rep, id)
			}
			if len(rep.Checks) != len(audit.Catalog()) {
				t.Fatalf("%d results for %d checks", len(rep.Checks), len(audit.Catalog()))
			}
			mustBeOK(t, rep, "sessions.locks_on_pgflow")
			mustBeOK(t, rep, "sessions.long_transactions")
			if name == "inflight" {
				// One live 0.16.0 worker per flow; the stopped one is not counted.
				if f := mustFire(t, rep, "workers.legacy_alive", audit.Warning); f.Count != 3 {
					t.Fatalf("live workers: %+v", f)
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
		db := testdb.Model(t)
		exec(t, db, `alter table pgflow.flows add column queue_name text`)
		rep := runAudit(t, db, audit.Options{Checks: []string{"schema.state"}})
		f := mustFire(t, rep, "schema.state", audit.Blocker)
		if rep.Schema.State != audit.StatePartial || !strings.Contains(f.Message, "column pgflow.flows.queue_name: extra") {
			t.Fatalf("state %s, message %q", rep.Schema.State, f.Message)
		}
	})
	t.Run("modified baseline", func(t *testing.T) {
		db := testdb.Model(t)
		exec(t, db, `alter table pgflow.step_tasks alter column message_id type integer`)
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
		if rep.Schema.State != audit.StateNotPgflow {
			t.Fatalf("state %s", rep.Schema.State)
		}
		// The checks that read pgflow tables are skipped, not errors.
		if r := result(t, rep, "queue.orphan_message"); r.Status != audit.StatusSkipped {
			t.Fatalf("orphan check on a database without pgflow: %s %s", r.Status, r.Error)
		}
	})
	t.Run("upgraded", func(t *testing.T) {
		db := oneFlow(t)
		all, err := migrations.All()
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.Pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range all {
			if _, err := tx.Exec(context.Background(), m.SQL); err != nil {
				tx.Rollback(context.Background())
				t.Skipf("the migration does not apply yet (%s): %v", m.File, err)
			}
		}
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		rep := runAudit(t, db, audit.Options{})
		f := mustFire(t, rep, "schema.state", audit.Info)
		if rep.Schema.State != audit.StateUpgraded {
			t.Fatalf("state %s: %s", rep.Schema.State, f.Message)
		}
		if rep.Blockers() != 0 || rep.Errors() != 0 {
			t.Fatalf("upgraded database: %d blockers, %d errors: %+v", rep.Blockers(), rep.Errors(), rep.Checks)
		}
	})
}

func TestPGMQInstalled(t *testing.T) {
	rep := runAudit(t, testdb.Empty(t), audit.Options{Checks: []string{"pgmq.installed"}})
	if f := mustFire(t, rep, "pgmq.installed", audit.Blocker); !strings.Contains(f.Message, "not installed") {
		t.Fatalf("message %q", f.Message)
	}
	db := testdb.Model(t)
	rep = runAudit(t, db, audit.Options{Checks: []string{"pgmq.installed"}})
	mustFire(t, rep, "pgmq.installed", audit.Info)
	exec(t, db, `drop function pgmq.set_vt(text, bigint, integer)`)
	rep = runAudit(t, db, audit.Options{Checks: []string{"pgmq.installed"}})
	if f := mustFire(t, rep, "pgmq.installed", audit.Blocker); !strings.Contains(f.Message, "pgmq.set_vt(text, bigint, integer)") {
		t.Fatalf("message %q", f.Message)
	}
}

func TestFlowQueueMissing(t *testing.T) {
	db := oneFlow(t)
	exec(t, db, `select pgflow.create_flow('g')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.flow_queue_missing"}}), "pgmq.flow_queue_missing")
	exec(t, db, `select pgmq.drop_queue('g')`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.flow_queue_missing"}}), "pgmq.flow_queue_missing", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slug", "g") {
		t.Fatalf("%+v", f)
	}
}

func TestQueuePhysical(t *testing.T) {
	db := oneFlow(t)
	exec(t, db, `select pgflow.create_flow('g')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}}), "pgmq.queue_physical")
	exec(t, db,
		`alter table pgmq.a_g drop column headers`,
		`alter table pgmq.q_g alter column msg_id drop identity`,
		`alter table pgmq.q_f alter column message type text`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}, Sample: 10}), "pgmq.queue_physical", audit.Blocker)
	if f.Count != 2 {
		t.Fatalf("count %d, want 2 queues: %+v", f.Count, f.Samples)
	}
	for _, want := range []string{"column headers is missing", "msg_id is not an identity column", "column message is text, expected jsonb"} {
		if !sampleHas(f, "problem", want) {
			t.Errorf("no problem %q in %+v", want, f.Samples)
		}
	}
	exec(t, db, `drop table pgmq.a_g`)
	f = mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"pgmq.queue_physical"}, Sample: 10}), "pgmq.queue_physical", audit.Blocker)
	if !sampleHas(f, "problem", "table is missing") || !sampleHas(f, "table", "pgmq.a_g") {
		t.Fatalf("%+v", f.Samples)
	}
}

func TestCaseAlias(t *testing.T) {
	db := oneFlow(t)
	exec(t, db, `select pgflow.create_flow('MyFlow')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"flows.case_alias"}}), "flows.case_alias")
	exec(t, db, `select pgflow.create_flow('myflow')`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"flows.case_alias"}}), "flows.case_alias", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "flow_slugs", "MyFlow, myflow") || !sampleHas(f, "queue_table", "pgmq.q_myflow") {
		t.Fatalf("%+v", f)
	}
}

func TestDuplicateMessageID(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"tasks.duplicate_message_id"}}), "tasks.duplicate_message_id")
	exec(t, db, `update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks)`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"tasks.duplicate_message_id"}}), "tasks.duplicate_message_id", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "tasks", "2") {
		t.Fatalf("%+v", f)
	}
}

func TestMessageMissing(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"tasks.message_missing"}}), "tasks.message_missing")
	var msgID int64
	if err := db.Pool.QueryRow(context.Background(),
		`select message_id from pgflow.step_tasks where run_id = '00000000-0000-4000-8000-000000000001'`).Scan(&msgID); err != nil {
		t.Fatal(err)
	}
	exec(t, db, `select pgmq.delete('f', `+itoa(msgID)+`::bigint)`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"tasks.message_missing"}}), "tasks.message_missing", audit.Warning)
	if f.Count != 1 || f.AtLeast || !sampleHas(f, "message_id", itoa(msgID)) {
		t.Fatalf("%+v", f)
	}
	// Message ids are strings in samples (exact in JSON).
	if _, ok := f.Samples[0]["message_id"].(string); !ok {
		t.Fatalf("message_id is %T, want string", f.Samples[0]["message_id"])
	}
}

func TestOrphanMessage(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"queue.orphan_message"}}), "queue.orphan_message")
	exec(t, db, `select pgmq.send('f', '{"foreign": true}'::jsonb)`,
		`select pgmq.send('f', '{"foreign": 2}'::jsonb)`,
		`select pgmq.send('f', '{"foreign": 3}'::jsonb)`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"queue.orphan_message"}}), "queue.orphan_message", audit.Blocker)
	if f.Count != 3 || f.AtLeast || !sampleHas(f, "body", `"foreign": true`) {
		t.Fatalf("%+v", f)
	}
	// Bounded: with room for 3 of the 5 messages (2 owned, then 3 orphans),
	// the count is a lower bound.
	f = mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"queue.orphan_message"}, Bound: 3}), "queue.orphan_message", audit.Blocker)
	if f.Count != 1 || !f.AtLeast {
		t.Fatalf("bounded: %+v", f)
	}
}

func TestEnvelopeContradiction(t *testing.T) {
	db := oneFlow(t)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"queue.envelope_contradiction"}}), "queue.envelope_contradiction")
	// A body that leaves fields out does not contradict its task.
	exec(t, db, `update pgmq.q_f set message = message - 'task_index'
	             where message ->> 'run_id' = '00000000-0000-4000-8000-000000000002'`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"queue.envelope_contradiction"}}), "queue.envelope_contradiction")
	exec(t, db, `update pgmq.q_f set message = jsonb_set(message, '{step_slug}', '"other"')
	             where message ->> 'run_id' = '00000000-0000-4000-8000-000000000001'`)
	f := mustFire(t, runAudit(t, db, audit.Options{Checks: []string{"queue.envelope_contradiction"}}), "queue.envelope_contradiction", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "differs", "step_slug") {
		t.Fatalf("%+v", f)
	}
}

func TestLegacyWorkers(t *testing.T) {
	db := oneFlow(t)
	exec(t, db, `insert into pgflow.workers (worker_id, queue_name, function_name, stopped_at)
	             values ('00000000-0000-4000-8000-00000000bb01', 'f', 'old', now())`,
		`insert into pgflow.workers (worker_id, queue_name, function_name, last_heartbeat_at)
	             values ('00000000-0000-4000-8000-00000000bb02', 'f', 'gone', now() - interval '1 hour')`)
	mustBeOK(t, runAudit(t, db, audit.Options{Checks: []string{"workers.legacy_alive"}}), "workers.legacy_alive")
	exec(t, db, `insert into pgflow.workers (worker_id, queue_name, function_name)
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

	other := connect(t, db.DSN)
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
	exec(t, db, `analyze pgflow.step_tasks`)
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
	fs, err := c.Run(ctx, tx, audit.Env{Sample: 5, PGMQ: audit.PGMQInfo{Installed: true, Kind: "schema"}})
	if err != nil || len(fs) != 0 {
		t.Fatalf("schema pgmq: %v %+v", err, fs)
	}
	// As an extension, pg_dump leaves the queues out.
	fs, err = c.Run(ctx, tx, audit.Env{Sample: 5, PGMQ: audit.PGMQInfo{Installed: true, Kind: "extension", Version: "1.5.1"}})
	if err != nil || len(fs) != 1 || fs[0].Severity != audit.Warning || fs[0].Count != 1 || !strings.Contains(fs[0].Message, "pg_dump") {
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
	exec(t, db, `select pgflow.create_flow('u')`, `select pgmq.drop_queue('u')`, `select pgmq.create_unlogged('u')`)
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
