package upgrade_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// testCtx bounds a test: a hang fails the test instead of the binary.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// inflightDB is a fresh database in the fixtures' inflight state.
func inflightDB(t *testing.T) *testdb.DB {
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

// connect opens one connection to db (closed at cleanup).
func connect(t *testing.T, db *testdb.DB) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
