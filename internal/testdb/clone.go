package testdb

import (
	"context"
	"testing"
)

// Clone returns a fresh database that is a copy of db as it is now (CREATE
// DATABASE ... TEMPLATE db, STRATEGY FILE_COPY on a local cluster), dropped
// when t ends. It is for a state that costs seconds to build (datagen's
// tens of thousands of rows) and that several subtests each need a copy of
// to change: the state is built once, and each copy costs a file copy
// instead of building it again.
//
//	state := testdb.Baseline(t)
//	datagen.Generate(ctx, state.Pool, shape) // once
//	t.Run(name, func(t *testing.T) { db := state.Clone(t); ... })
//
// PostgreSQL copies a database only while no session is connected to it:
// Clone closes db.Pool's idle sessions first (the pool stays usable, and
// opens new ones on its next use), and fails the test if one of them is
// in use. Nothing else may use db while it is cloned, so the subtests that
// clone it run one after the other, or clone it before they run in
// parallel. The clone has what the database's files hold (schemas, rows,
// planner statistics), not what the server keeps per database elsewhere:
// ALTER DATABASE ... SET settings and the statistics counters
// (pg_stat_*) start empty, as in any new database. Its Pool is a
// session.Test one, as Baseline's; pg_cron jobs recorded in db are
// pointed at the clone, as Baseline points the template's at its clone.
func (db *DB) Clone(t testing.TB) *DB {
	t.Helper()
	if n := db.Pool.Stat().AcquiredConns(); n > 0 {
		t.Fatalf("testdb: cloning %s while %d of its pool's sessions are in use: PostgreSQL copies a database only while no session is connected to it", db.Name, n)
	}
	// A Baseline's cron jobs name its database (see fresh): the clone's
	// name the clone. A database without the cron schema has none.
	var hasCron bool
	if err := db.Pool.QueryRow(context.Background(), `select pg_catalog.to_regclass('cron.job') is not null`).Scan(&hasCron); err != nil {
		t.Fatalf("testdb: looking for cron.job in %s: %v", db.Name, err)
	}
	// Idle sessions are closed in the background: CREATE DATABASE waits
	// for them to end (and CreateDatabase retries while the source is
	// "being accessed by other users").
	db.Pool.Reset()
	return cloneOf(t, db.Name, hasCron)
}
