package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// The failure the audit predicts, reproduced as an operator meets it: on
// pgflow 0.16.0 with upstream's example flow, pgmq's own update to the
// newest release fails in its 1.9.0 → 1.10.0 step, which alters each queue
// table by its pgmq.meta name, quoted, while the table was created in lower
// case. A lower-case flow updates.
func TestPGMQUpdateFailsOnMixedCaseQueue(t *testing.T) {
	ctx := context.Background()
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	db := testdb.Baseline(t).AnalyzeWebsite(t)
	_, err := db.Pool.Exec(ctx, `alter extension pgmq update to '`+testdb.PGMQNewest+`'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.Contains(pgErr.Message, `q_`+fixtures.AnalyzeWebsiteSlug) {
		t.Fatalf("the update with a mixed-case queue: want 42P01 naming pgmq.q_%s, got %v", fixtures.AnalyzeWebsiteSlug, err)
	}
	t.Logf("as expected: %v (where: %s)", err, pgErr.Where)
	if v := db.PGMQVersion(t); v != "1.5.1" {
		t.Fatalf("a failed update left pgmq at %s", v)
	}

	lower := testdb.Baseline(t)
	lower.Exec(t, `select pgflow.create_flow('analyze_website')`)
	lower.UpdatePGMQ(t, testdb.PGMQNewest)
	if v := lower.PGMQVersion(t); v != testdb.PGMQNewest {
		t.Fatalf("pgmq %s after the update", v)
	}
}

// On a real 0.16.0 with upstream's example flow the audit says, before
// anyone tries, that the update to the newest pgmq would fail, why and
// what it would lock; and that pg_dump leaves out what pgmq 1.5.1 keeps as
// extension members. On the same database with lower-case flows only it
// says the update would go through.
func TestAuditPGMQUpdatePathMixedCase(t *testing.T) {
	ctx := context.Background()
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	db := testdb.Baseline(t).AnalyzeWebsite(t, `select pgflow.create_flow('greet')`)
	rep := runAudit(t, db, audit.Options{Checks: []string{"pgmq.installed", "pgmq.update_path", "pgmq.claim_path", "backup.pgdump_pgmq"}})
	if rep.PGMQ.Version != "1.5.1" || rep.PGMQ.Layout != "members" || rep.PGMQ.Newest != testdb.PGMQNewest {
		t.Fatalf("pgmq info %+v", rep.PGMQ)
	}
	inst := mustFire(t, rep, "pgmq.installed", audit.Info)
	if !strings.Contains(inst.Message, "1.5.1") || !strings.Contains(inst.Message, "extension members") {
		t.Errorf("pgmq.installed does not name version and layout: %q", inst.Message)
	}
	f := mustFire(t, rep, "pgmq.update_path", audit.Warning)
	t.Logf("pgmq.update_path: %s", f.Message)
	for _, want := range []string{"would fail", "1.9.0 → 1.10.0", `pgmq."q_` + fixtures.AnalyzeWebsiteSlug + `"`, "pgmq.q_analyzewebsite", "ACCESS EXCLUSIVE", "2 queue and 2 archive", "pgflow.flows"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("pgmq.update_path message lacks %q: %s", want, f.Message)
		}
	}
	if f.Count != 1 || !sampleHas(f, "queue", fixtures.AnalyzeWebsiteSlug) || sampleHas(f, "queue", "greet") {
		t.Errorf("pgmq.update_path counts %d, samples %v: want the one mixed-case queue", f.Count, f.Samples)
	}
	mustBeOK(t, rep, "pgmq.claim_path")
	b := mustFire(t, rep, "backup.pgdump_pgmq", audit.Warning)
	if b.Count != 2 || !strings.Contains(b.Message, "2 of 2 queue(s)") || !strings.Contains(b.Message, "pgmq.meta") {
		t.Errorf("backup on 1.5.1: %d %q", b.Count, b.Message)
	}

	// The prediction is the server's own answer: the update fails as said.
	if _, err := db.Pool.Exec(ctx, `alter extension pgmq update to '`+testdb.PGMQNewest+`'`); err == nil {
		t.Fatal("the update went through where the audit said it would fail")
	}
	// Lower-case flows only: it would go through, and it does.
	lower := testdb.Baseline(t)
	lower.Exec(t, `select pgflow.create_flow('greet')`)
	rep = runAudit(t, lower, audit.Options{Checks: []string{"pgmq.update_path"}})
	if f := mustFire(t, rep, "pgmq.update_path", audit.Info); !strings.Contains(f.Message, "would go through") {
		t.Errorf("lower-case flows: %q", f.Message)
	}
	lower.UpdatePGMQ(t, testdb.PGMQNewest)
}

// From 1.6.0 pg_dump includes pgmq.meta and the queue tables: the backup
// finding is gone on 1.13.1, and says nothing about nothing with 0 queues.
func TestAuditBackupAcrossPGMQVersions(t *testing.T) {
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	empty := testdb.Baseline(t)
	rep := runAudit(t, empty, audit.Options{Checks: []string{"backup.pgdump_pgmq"}})
	mustBeOK(t, rep, "backup.pgdump_pgmq") // 1.5.1, no queue: nothing is left out

	db := testdb.Baseline(t)
	db.Exec(t, `select pgflow.create_flow('greet')`, `select pgflow.create_flow('other')`)
	db.UpdatePGMQ(t, testdb.PGMQNewest)
	rep = runAudit(t, db, audit.Options{Checks: []string{"backup.pgdump_pgmq", "pgmq.installed", "pgmq.update_path", "pgmq.claim_path"}})
	if rep.PGMQ.Version != testdb.PGMQNewest || rep.PGMQ.Layout != "detached" {
		t.Fatalf("pgmq info %+v", rep.PGMQ)
	}
	mustBeOK(t, rep, "backup.pgdump_pgmq")
	mustBeOK(t, rep, "pgmq.claim_path")
	if f := mustFire(t, rep, "pgmq.update_path", audit.Info); !strings.Contains(f.Message, "newest version this server offers") {
		t.Errorf("on the newest: %q", f.Message)
	}
	if f := mustFire(t, rep, "pgmq.installed", audit.Info); !strings.Contains(f.Message, "not extension members") {
		t.Errorf("pgmq.installed on 1.13.1: %q", f.Message)
	}
}

// A pgmq stopped at 1.10.1 with queues from before 1.10.0 breaks the claim
// path: a blocker, with the queues named; a queue created on 1.10.1 works
// and is not named. The claim really fails there (42804), so the finding
// is no guess.
func TestAuditPGMQ1101IsBlocker(t *testing.T) {
	ctx := context.Background()
	testdb.RequirePGMQVersion(t, "1.10.1")
	db := testdb.Baseline(t)
	db.Exec(t, `select pgflow.create_flow('greet')`, `select pgmq.send('greet', '{}')`)
	db.UpdatePGMQ(t, "1.10.1")
	db.Exec(t, `select pgmq.create('fresh')`)
	rep := runAudit(t, db, audit.Options{})
	f := mustFire(t, rep, "pgmq.claim_path", audit.Blocker)
	if f.Count != 1 || !sampleHas(f, "queue", "greet") || sampleHas(f, "queue", "fresh") || !strings.Contains(f.Message, "1.10.1") {
		t.Errorf("claim_path: %d %q %v", f.Count, f.Message, f.Samples)
	}
	if rep.Blockers() == 0 {
		t.Error("the audit says GO on pgmq 1.10.1")
	}
	_, err := db.Pool.Exec(ctx, `select * from pgmq.read('greet', 30, 1)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42804" {
		t.Fatalf("pgmq.read on 1.10.1: %v, want 42804", err)
	}
	if _, err := db.Pool.Exec(ctx, `select * from pgmq.read('fresh', 30, 1)`); err != nil {
		t.Fatalf("a queue created on 1.10.1: %v", err)
	}
}
