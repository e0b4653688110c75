package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// The pooler tests run audit and apply through PgBouncer in transaction
// mode (internal/pgprovider.StartBouncer), where a session SET, a session
// advisory lock and a named prepared statement do not outlive the
// transaction: the server connection goes back to the pool at COMMIT and the
// client's next transaction may run on another one.

// pooled starts a bouncer in front of the test server for this test;
// without pgbouncer installed the test is skipped, saying so.
func pooled(t *testing.T) *pgprovider.Bouncer {
	t.Helper()
	b, err := pgprovider.StartBouncer(context.Background(), testdb.Server(t))
	if errors.Is(err, pgprovider.ErrNoPgBouncer) {
		t.Skipf("pooler test not run: %v", err)
	}
	if err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// viaBouncer is the bouncer DSN of db with the given exec mode ("" leaves
// default_query_exec_mode out: pgx's default, the statement cache).
func viaBouncer(t *testing.T, b *pgprovider.Bouncer, db *testdb.DB, mode string) string {
	t.Helper()
	u, err := url.Parse(b.DSNFor(dbName(t, db)))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if mode == "" {
		q.Del("default_query_exec_mode")
	} else {
		q.Set("default_query_exec_mode", mode)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func dbName(t *testing.T, db *testdb.DB) string {
	t.Helper()
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// TestPoolerExecModes measures which pgx query exec modes survive PgBouncer
// in transaction mode, outside and inside a transaction, when another client
// takes the server connection in between (forcing a switch): the table in
// docs/hardening.md comes from here.
func TestPoolerExecModes(t *testing.T) {
	b := pooled(t)
	db := testdb.Empty(t)
	ctx := context.Background()
	want := map[string]bool{ // mode → works everywhere through the pooler
		"simple_protocol": true,
		"exec":            true,
		"cache_statement": false,
		// pgx refuses the combination: turning the cache off is not enough.
		"cache_statement&statement_cache_capacity=0": false,
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol", "cache_statement&statement_cache_capacity=0", "cache_describe&description_cache_capacity=0"} {
		t.Run(mode, func(t *testing.T) {
			// "mode&key=value" adds a cache setting to the connection string.
			extra := ""
			if i := strings.IndexByte(mode, '&'); i >= 0 {
				mode, extra = mode[:i], mode[i:]
			}
			dsnMode := viaBouncer(t, b, db, mode) + extra
			// Raw, unpinned on purpose: what the pooler does to a client's
			// prepared statements, whatever the tool adds.
			a, err := session.Open(ctx, dsnMode, session.Raw)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			other, err := session.Open(ctx, viaBouncer(t, b, db, "simple_protocol"), session.Raw)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(ctx)
			var errs []string
			query := func(where string, q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}) {
				for i := 0; i < 3; i++ {
					var n int
					if err := q.QueryRow(ctx, "select $1::int + 1", i).Scan(&n); err != nil || n != i+1 {
						errs = append(errs, fmt.Sprintf("%s, query %d: %v", where, i, err))
						return
					}
					// Another client pins the server connection a just used
					// (PgBouncer hands out the most recent one first), so a's
					// next query runs on another server connection.
					tx, err := other.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := tx.Exec(ctx, "select 1"); err != nil {
						t.Fatal(err)
					}
					err = q.QueryRow(ctx, "select $1::int + 1", i).Scan(&n)
					_ = tx.Rollback(ctx)
					if err != nil || n != i+1 {
						errs = append(errs, fmt.Sprintf("%s, query %d after a switch: %v", where, i, err))
						return
					}
				}
			}
			query("outside a transaction", a)
			tx, err := a.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			query("inside a transaction", tx)
			_ = tx.Rollback(ctx)
			works := len(errs) == 0
			t.Logf("PgBouncer transaction mode, default_query_exec_mode=%s%s: works=%v %s", mode, extra, works, strings.Join(errs, "; "))
			if w, known := want[mode+extra]; known && w != works {
				t.Fatalf("mode %s: works=%v, docs/hardening.md says %v: %v", mode, works, w, errs)
			}
		})
	}
}

// TestPoolerAudit: audit through the pooler, with the documented settings and
// with a connection string that has none, and with its timeouts holding: a
// lock held on step_tasks makes the checks that read it inconclusive (exit 4)
// instead of waiting behind it, and no SET leaks into the pooled server
// connections.
func TestPoolerAudit(t *testing.T) {
	b := pooled(t)
	db := clitest.LegacyDB(t)
	ctx := context.Background()
	for _, mode := range []string{"simple_protocol", "exec", ""} {
		r := clitest.Run(t, nil, "--dsn", viaBouncer(t, b, db, mode), "audit")
		if r.Code != cli.ExitOK {
			t.Errorf("audit through PgBouncer (default_query_exec_mode=%q): exit %d\n%s%s", mode, r.Code, r.Stdout, r.Stderr)
		}
	}

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `lock table pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	r := clitest.Run(t, nil, "--dsn", viaBouncer(t, b, db, "simple_protocol"), "audit", "--lock-timeout", "100ms", "--check-timeout", "30s")
	_ = tx.Rollback(ctx)
	if r.Code != cli.ExitInconclusive || !strings.Contains(r.Stdout, "inconclusive") {
		t.Fatalf("audit behind a lock through the pooler: exit %d, want %d (lock_timeout must hold)\n%s%s", r.Code, cli.ExitInconclusive, r.Stdout, r.Stderr)
	}

	// Every server connection of the pool is back at the server defaults:
	// the audit's settings were SET LOCAL.
	conns := make([]*pgx.Conn, 0, 4)
	defer func() {
		for _, c := range conns {
			c.Close(ctx)
		}
	}()
	seen := map[uint32]bool{}
	for i := 0; i < 4; i++ {
		// Raw: plain clients of the pooler, holding its server connections.
		c, err := session.Open(ctx, viaBouncer(t, b, db, "simple_protocol"), session.Raw)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		ctx := ctx
		tx, err := c.Begin(ctx) // pin a server connection per client
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var pid uint32
		var lockTimeout, stmtTimeout, readOnly string
		if err := tx.QueryRow(ctx, `select pg_backend_pid(), current_setting('lock_timeout'), current_setting('statement_timeout'), current_setting('transaction_read_only')`).Scan(&pid, &lockTimeout, &stmtTimeout, &readOnly); err != nil {
			t.Fatal(err)
		}
		seen[pid] = true
		if lockTimeout != "0" || stmtTimeout != "0" || readOnly != "off" {
			t.Fatalf("server connection %d kept a setting of the audit: lock_timeout %s, statement_timeout %s, read only %s", pid, lockTimeout, stmtTimeout, readOnly)
		}
	}
	t.Logf("checked %d server connections of the pool", len(seen))
}

// TestPoolerApplyAdvisoryLock: the advisory lock is transaction-level, so it
// holds through the pooler. Apply A stops inside its transaction (holding the
// lock, test hook) while apply B runs through the bouncer: B must exit 1
// saying another apply is running, change nothing, and A then migrates.
func TestPoolerApplyAdvisoryLock(t *testing.T) {
	b := pooled(t)
	db := clitest.LegacyDB(t)
	ctx := context.Background()
	before := testdb.State(t, db.Pool)

	// Pinned as the CLI's apply is (per transaction, if the pooler refuses
	// the startup parameter: session.Connect).
	connA, err := session.Open(ctx, viaBouncer(t, b, db, "exec"), session.Test)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close(ctx)
	holding, release := make(chan struct{}), make(chan struct{})
	type applied struct {
		rep *outcome.Result[*upgrade.Report]
		err error
	}
	done := make(chan applied, 1)
	go func() {
		rep, err := upgrade.Apply(ctx, connA, upgrade.Options{LockRetries: 1, Hooks: upgrade.Hooks{
			BeforeStep: func(ctx context.Context, pid uint32, step string) error {
				if step == upgrade.StepState {
					close(holding)
					<-release
				}
				return nil
			},
		}})
		done <- applied{rep, err}
	}()
	select {
	case <-holding:
	case o := <-done:
		t.Fatalf("apply A ended before taking the advisory lock: %v", o.err)
	}

	r := clitest.Run(t, nil, "--dsn", viaBouncer(t, b, db, "simple_protocol"), "apply", "--yes", "--wait", "0s")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout+r.Stderr, "another pgflow-upgrade apply is running") {
		close(release)
		<-done
		t.Fatalf("apply B through the pooler while A holds the lock: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "apply B while A holds the advisory lock")
	close(release)
	o := <-done
	if o.err != nil || o.rep.Outcome != outcome.Applied {
		t.Fatalf("apply A: %v (%+v)", o.err, o.rep)
	}
	var revisions int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow_upgrade.schema_revisions`).Scan(&revisions); err != nil || revisions != 1 {
		t.Fatalf("schema_revisions: %d rows (%v), want 1", revisions, err)
	}
}

// TestPoolerConcurrentApplies: two applies at once through the pooler, no
// hooks: whatever the interleaving, exactly one migrates; the other waits for
// the lock and finds the work done, or gives up saying why. They run as
// separate processes (the built binary): urfave/cli's global flags make
// in-process runs unsafe to run concurrently.
func TestPoolerConcurrentApplies(t *testing.T) {
	testdb.SkipIfShort(t, "two applies at once through PgBouncer: exactly one migrates")
	b := pooled(t)
	db := clitest.LegacyDB(t)
	procs := make([]*started, 2)
	for i := range procs {
		procs[i] = start(t, nil, "--dsn", viaBouncer(t, b, db, "simple_protocol"), "--format", "json", "apply", "--yes")
	}
	applied := 0
	for _, p := range procs {
		code := p.wait(t)
		out := p.stdout.String()
		switch {
		case code == cli.ExitOK && strings.Contains(out, `"outcome": "applied"`):
			applied++
		case code == cli.ExitOK && strings.Contains(out, `"outcome": "already_applied"`):
		case code == cli.ExitFindings && strings.Contains(out, `"outcome": "lock_busy"`):
		default:
			t.Errorf("unexpected result: exit %d\n%s", code, p.output())
		}
	}
	if applied != 1 {
		t.Fatalf("%d applies migrated, want exactly 1", applied)
	}
}

// TestPoolerApplySingleTransaction: a preflight blocker found through the
// pooler rolls everything back (the DDL of the migration never runs, the
// locks go with the transaction), and a dry run leaves nothing either.
func TestPoolerApplySingleTransaction(t *testing.T) {
	b := pooled(t)
	db := clitest.LegacyDB(t)
	db.Exec(t, `select pgflow.create_flow('Legacy')`)
	before := testdb.State(t, db.Pool)
	r := clitest.Run(t, nil, "--dsn", viaBouncer(t, b, db, "simple_protocol"), "apply", "--yes")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "flows.case_alias") {
		t.Fatalf("apply with a blocker through the pooler: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply through the pooler")

	db.Exec(t, `delete from pgflow.flows where flow_slug = 'Legacy'`)
	before = testdb.State(t, db.Pool)
	r = clitest.Run(t, nil, "--dsn", viaBouncer(t, b, db, "simple_protocol"), "apply", "--yes", "--dry-run")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "dry_run") {
		t.Fatalf("dry run through the pooler: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "dry run through the pooler")

	// No lock is left behind in the pool: a direct session can take them all.
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `set local lock_timeout = '1s'; lock table pgflow.flows, pgflow.step_tasks in access exclusive mode`); err != nil {
		t.Fatalf("a lock of the refused apply outlived its transaction: %v", err)
	}
}

// TestPoolerConcurrentAudits: several audits at once through the pooler, so
// server connections are shuffled between their transactions. With the
// documented setting (simple_protocol) every one succeeds. With a plain
// connection string pgx's default statement cache names prepared statements
// that live on one server connection and are missing (or already exist) on
// the next: the tool should not depend on the user knowing that.
func TestPoolerConcurrentAudits(t *testing.T) {
	testdb.SkipIfShort(t, "concurrent audits through PgBouncer with a plain DSN all succeed")
	b := pooled(t)
	db := clitest.LegacyDB(t)
	audits := func(mode string) []string {
		procs := make([]*started, 6)
		for i := range procs {
			procs[i] = start(t, nil, "--dsn", viaBouncer(t, b, db, mode), "audit")
		}
		var failed []string
		for _, p := range procs {
			if code := p.wait(t); code != cli.ExitOK {
				failed = append(failed, fmt.Sprintf("exit %d: %.400s", code, p.output()))
			}
		}
		return failed
	}
	if failed := audits("simple_protocol"); len(failed) > 0 {
		t.Fatalf("concurrent audits with default_query_exec_mode=simple_protocol failed:\n%s", strings.Join(failed, "\n"))
	}
	if failed := audits(""); len(failed) > 0 {
		t.Fatalf("%d of 6 concurrent audits through PgBouncer with a plain DSN failed:\n%s", len(failed), strings.Join(failed, "\n"))
	}
}

// TestPoolerConcurrentStatusVerify: status and verify, several at once
// through the pooler with a plain connection string, as audit above.
func TestPoolerConcurrentStatusVerify(t *testing.T) {
	testdb.SkipIfShort(t, "concurrent status and verify through PgBouncer with a plain DSN all succeed")
	b := pooled(t)
	db := clitest.UpgradedDB(t)
	procs := make([]*started, 8)
	for i := range procs {
		cmd := []string{"status", "verify"}[i%2]
		procs[i] = start(t, nil, "--dsn", viaBouncer(t, b, db, ""), cmd)
	}
	var failed []string
	for _, p := range procs {
		if code := p.wait(t); code != cli.ExitOK {
			failed = append(failed, fmt.Sprintf("exit %d: %.400s", code, p.output()))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d status/verify runs through PgBouncer with a plain DSN failed:\n%s", len(failed), len(procs), strings.Join(failed, "\n"))
	}
}
