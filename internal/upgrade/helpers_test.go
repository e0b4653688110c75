package upgrade_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// testCtx bounds a test: a hang fails the test instead of the binary.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// inflightDB is a fresh real 0.16.0 database with work in flight, driven
// through its own engine: a mixed-case flow whose first step completed and
// whose map tasks are queued, a root map with one task started by a 0.16.0
// worker, a failed run and a retried task.
func inflightDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	ctx := context.Background()
	for _, s := range []string{
		`select pgflow.create_flow('Legacy_Flow')`,
		`select pgflow.add_step('Legacy_Flow', 'first')`,
		`select pgflow.add_step('Legacy_Flow', 'items', array['first'], step_type => 'map')`,
		`select pgflow.create_flow('root_map', max_attempts => 2, base_delay => 0)`,
		`select pgflow.add_step('root_map', 'each', step_type => 'map')`,
		`select pgflow.start_flow('Legacy_Flow', '{"n": 1}', '00000000-0000-0000-0000-000000000001')`,
		`select pgflow.start_flow('root_map', '[1, 2, 3]', '00000000-0000-0000-0000-000000000002')`,
		`select pgflow.start_flow('root_map', '[4]', '00000000-0000-0000-0000-000000000003')`,
		`insert into pgflow.workers (worker_id, queue_name, function_name) values ('00000000-0000-0000-0000-0000000000aa', 'Legacy_Flow', 'fn')`,
		`select count(*) from pgflow.start_tasks('Legacy_Flow', array(select msg_id from pgmq.read('Legacy_Flow', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.complete_task('00000000-0000-0000-0000-000000000001', 'first', 0, '[1, 2]')`,
		`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000002', 'each', 0, 'retry me')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000003', 'each', 0, 'boom')`,
		`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 10)), '00000000-0000-0000-0000-0000000000aa')`,
		`select count(*) from pgflow.fail_task('00000000-0000-0000-0000-000000000003', 'each', 0, 'boom again')`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("building the in-flight state: %s: %v", s, err)
		}
	}
	return db
}

// connect opens one connection to db (closed at cleanup).
func connect(t *testing.T, db *testdb.DB) *pgx.Conn {
	t.Helper()
	conn, err := session.Open(context.Background(), db.DSN, session.Test)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
