package testdb

import (
	"context"
	"os"
	"sync"
	"testing"
)

// HoldLock runs stmt (a LOCK TABLE, or any statement that takes locks) in a
// transaction of its own on db and keeps that transaction open until the
// returned release is called or the test ends.
func (db *DB) HoldLock(t testing.TB, stmt string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, stmt); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(release)
	return release
}

// SkipIfShort skips a long test under -short (make test-short, the inner
// loop), saying what it proves and that make test runs it.
func SkipIfShort(t testing.TB, proves string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("long test skipped under -short (make test runs it): %s", proves)
	}
}

// envLong turns on the tests that take longer than make test's clock allows
// (real upstream databases at every release, fleets of databases, faults).
const envLong = "PGFLOW_UPGRADE_LONG"

// SkipUnlessLong skips a TestLong... test unless PGFLOW_UPGRADE_LONG=1
// (make test-long, which CI runs after make test), saying what it proves.
func SkipUnlessLong(t testing.TB, proves string) {
	t.Helper()
	if os.Getenv(envLong) != "1" {
		t.Skipf("long test skipped (make test-long runs it, with %s=1): %s", envLong, proves)
	}
}
