package testdb

import (
	"context"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
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
	s := Server(t)
	ctx := context.Background()
	if n := db.Pool.Stat().AcquiredConns(); n > 0 {
		t.Fatalf("testdb: cloning %s while %d of its pool's sessions are in use: PostgreSQL copies a database only while no session is connected to it", db.Name, n)
	}
	// Idle sessions are closed in the background: CREATE DATABASE waits
	// for them to end (and CreateDatabase retries while the source is
	// "being accessed by other users").
	db.Pool.Reset()
	name := pgprovider.RandomName("pgflow_upgrade_test")
	if err := s.CreateDatabase(ctx, name, db.Name); err != nil {
		t.Fatalf("testdb: cloning %s: %v", db.Name, err)
	}
	clone := &DB{Name: name, DSN: s.DSNFor(name)}
	t.Cleanup(func() {
		if clone.Pool != nil {
			clone.Pool.Close()
		}
		if err := s.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("testdb: %v", err)
		}
	})
	var err error
	clone.Pool, err = session.OpenPool(ctx, clone.DSN, session.Options{Purpose: session.Test, MaxConns: 20})
	if err != nil {
		t.Fatalf("testdb: connecting to %s: %v", name, err)
	}
	// A Baseline's cron jobs name its database (see fresh): the clone's
	// name this one. A database without the cron schema has none.
	var hasCron bool
	if err := clone.Pool.QueryRow(ctx, `select pg_catalog.to_regclass('cron.job') is not null`).Scan(&hasCron); err != nil {
		t.Fatalf("testdb: looking for cron.job in %s: %v", name, err)
	}
	if hasCron {
		if _, err := clone.Pool.Exec(ctx, `update cron.job set database = pg_catalog.current_database() where database = $1`, db.Name); err != nil {
			t.Fatalf("testdb: pointing the cloned cron jobs at %s: %v", name, err)
		}
	}
	return clone
}
