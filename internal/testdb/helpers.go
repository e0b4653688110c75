package testdb

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Connect opens one more connection to dsn as the harness hands them out
// (session.Test: search_path pinned), closed when the test ends.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := session.Open(context.Background(), dsn, session.Test)
	if err != nil {
		t.Fatalf("testdb: connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Exec runs one statement with its arguments on q (a pool, a connection or
// a transaction) and fails the test, naming the statement, when it fails.
func Exec(t testing.TB, q session.Querier, sql string, args ...any) {
	t.Helper()
	if _, err := q.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("testdb: %s: %v", sql, err)
	}
}

// Exec runs setup statements on db's pool, in order, and fails the test,
// naming the statement, at the first that fails.
func (db *DB) Exec(t testing.TB, sqls ...string) {
	t.Helper()
	for _, s := range sqls {
		Exec(t, db.Pool, s)
	}
}

// Fingerprint is every row and queue message of db (fingerprint.Take),
// to compare with a later one.
func (db *DB) Fingerprint(t testing.TB) *fingerprint.Fingerprint {
	t.Helper()
	fp, err := fingerprint.Take(context.Background(), db.Pool)
	if err != nil {
		t.Fatalf("testdb: fingerprinting %s: %v", db.Name, err)
	}
	return fp
}

// AnalyzeWebsite adds upstream's example flow analyzeWebsite to db through
// pgflow's own functions (fixtures.CreateAnalyzeWebsite: on pgflow 0.16.0 a
// mixed-case queue, which the plain pgmq update fails on), then runs stmts
// (its runs, say) like Exec.
func (db *DB) AnalyzeWebsite(t testing.TB, stmts ...string) *DB {
	t.Helper()
	if err := fixtures.CreateAnalyzeWebsite(context.Background(), db.Pool); err != nil {
		t.Fatalf("testdb: creating analyzeWebsite: %v", err)
	}
	db.Exec(t, stmts...)
	return db
}

// PasswordRole is LoginRole for a role that logs in with password: the DSN
// carries it (tests that prove a password is never printed need one).
func (db *DB) PasswordRole(t testing.TB, prefix, password string, grants ...string) (role, dsn string) {
	t.Helper()
	return db.loginRole(t, prefix, "password "+quoteLiteral(password), url.UserPassword, password, grants)
}

// loginRole creates the role of LoginRole and PasswordRole; user makes the
// DSN's user information from the role and password.
func (db *DB) loginRole(t testing.TB, prefix, attrs string, user func(name, password string) *url.Userinfo, password string, grants []string) (role, dsn string) {
	t.Helper()
	ctx := context.Background()
	role = pgprovider.RandomName(prefix)
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := db.Pool.Exec(ctx, "create role "+ident+" login "+attrs); err != nil {
		t.Fatalf("testdb: creating role %s: %v", role, err)
	}
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "drop owned by "+ident+"; drop role "+ident); err != nil {
			t.Errorf("testdb: dropping role %s: %v", role, err)
		}
	})
	for _, g := range grants {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf(g, ident)); err != nil {
			t.Fatalf("testdb: %s: %v", fmt.Sprintf(g, ident), err)
		}
	}
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	u.User = user(role, password)
	return role, u.String()
}

// Inflight is a fresh real 0.16.0 database with work in flight, driven
// through its own engine: a mixed-case flow (queue 'Legacy_Flow', 0.17.0
// queue_name 'legacy_flow') whose first step completed and whose map tasks
// are queued; a root map of mapItems tasks (max 2 attempts, no delay) with
// tasks started by a registered 0.16.0 worker, one completed and one
// retried; and a run whose only task failed twice (the run failed).
func Inflight(t testing.TB, mapItems int) *DB {
	t.Helper()
	db := Baseline(t)
	db.Exec(t, InflightStatements(mapItems)...)
	return db
}

// InflightStatements are the statements of Inflight, for a test that puts
// the same work in flight on a database of its own.
func InflightStatements(mapItems int) []string {
	items := make([]string, mapItems)
	for i := range items {
		items[i] = fmt.Sprint(i + 1)
	}
	return []string{
		`select pgflow.create_flow('Legacy_Flow')`,
		`select pgflow.add_step('Legacy_Flow', 'first')`,
		`select pgflow.add_step('Legacy_Flow', 'items', array['first'], step_type => 'map')`,
		`select pgflow.create_flow('root_map', max_attempts => 2, base_delay => 0)`,
		`select pgflow.add_step('root_map', 'each', step_type => 'map')`,
		`select pgflow.start_flow('Legacy_Flow', '{"n": 1}', '00000000-0000-0000-0000-000000000001')`,
		`select pgflow.start_flow('root_map', '[` + strings.Join(items, ", ") + `]', '00000000-0000-0000-0000-000000000002')`,
		`select pgflow.start_flow('root_map', '[4]', '00000000-0000-0000-0000-000000000003')`,
		`insert into pgflow.workers (worker_id, queue_name, function_name) values ('00000000-0000-0000-0000-0000000000aa', 'Legacy_Flow', 'fn')`,
		`select count(*) from pgflow.start_tasks('Legacy_Flow', array(select msg_id from pgmq.read('Legacy_Flow', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.complete_task('00000000-0000-0000-0000-000000000001', 'first', 0, '[1, 2]')`,
		`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000002', 'each', 0, 'retry me')`,
		`select count(*) from pgflow.complete_task('00000000-0000-0000-0000-000000000002', 'each', 1, '"one"')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000003', 'each', 0, 'boom')`,
		`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000003', 'each', 0, 'boom again')`,
	}
}
