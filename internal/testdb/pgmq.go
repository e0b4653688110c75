package testdb

import (
	"context"
	"os"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// pgmqSetupHint is what to run when the server lacks a pgmq version a test
// needs: scripts/setup.sh installs pgmq's update scripts next to the
// vendored release.
const pgmqSetupHint = "run `make setup` (scripts/setup.sh installs pgmq's update scripts from ../shared/vendor/pgmq-updates-1.13.1 " +
	"into the server's extension directory, next to the vendored 1.5.1)"

// PGMQNewest is the newest pgmq release whose update scripts the project
// vendors; the tests of the pgmq hop take databases there.
const PGMQNewest = "1.13.1"

// pgmqNewestOffered is the newest pgmq version the server can install or
// update to ("" without pgmq), ordered as version numbers, not as text.
func pgmqNewestOffered(ctx context.Context, q session.Querier) (string, error) {
	var v string
	err := q.QueryRow(ctx, `select coalesce((select v.version from pg_catalog.pg_available_extension_versions v
	     where v.name = 'pgmq' and v.version ~ '^[0-9]+(\.[0-9]+)*$'
	     order by pg_catalog.string_to_array(v.version, '.')::int[] desc limit 1), '')`).Scan(&v)
	return v, err
}

// RequirePGMQVersion fails t when the server cannot take pgmq to version,
// saying what to run: a test of a later pgmq that quietly did not run would
// count as passing. Only a run that chose another pgmq skips it, saying so:
// the stand-in (PGFLOW_UPGRADE_PGMQ_STANDIN=1) has no versions, and
// templates already updated (PGFLOW_UPGRADE_TEST_PGMQ) do not start at
// 1.5.1.
func RequirePGMQVersion(t testing.TB, version string) {
	t.Helper()
	if os.Getenv(envPGMQStandIn) == "1" {
		t.Skipf("needs the real pgmq extension updated to %s; this run uses the project's stand-in (PGFLOW_UPGRADE_PGMQ_STANDIN=1)", version)
	}
	if v := os.Getenv(envPGMQVersion); v != "" {
		t.Skipf("takes pgmq from 1.5.1 to %s itself; this run's templates are already at %s (%s)", version, v, envPGMQVersion)
	}
	conn, err := session.Open(context.Background(), Server(t).AdminDSN(), session.Admin)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer conn.Close(context.Background())
	var offered bool
	if err := conn.QueryRow(context.Background(), `select exists (select 1 from pg_catalog.pg_available_extension_versions
	     where name = 'pgmq' and version = $1)`, version).Scan(&offered); err != nil {
		t.Fatalf("testdb: asking the server about pgmq %s: %v", version, err)
	}
	if !offered {
		t.Fatalf("testdb: the server offers no pgmq %s: %s", version, pgmqSetupHint)
	}
}

// UpdatePGMQ takes db's pgmq extension to version as an operator would
// (ALTER EXTENSION pgmq UPDATE TO version: PostgreSQL runs each update
// script of the chain in one transaction) and logs both versions. It fails
// t when db has the stand-in (no extension to update) or the server lacks
// the scripts, saying what to run.
func (db *DB) UpdatePGMQ(t testing.TB, version string) {
	t.Helper()
	RequirePGMQVersion(t, version)
	ctx := context.Background()
	from := db.PGMQVersion(t)
	if from == "" {
		t.Fatalf("testdb: database %s has no pgmq extension to update (the stand-in? unset PGFLOW_UPGRADE_PGMQ_STANDIN)", db.Name)
	}
	if _, err := db.Pool.Exec(ctx, "alter extension pgmq update to "+quoteLiteral(version)); err != nil {
		t.Fatalf("testdb: alter extension pgmq update to %s (from %s): %v", version, from, err)
	}
	t.Logf("testdb: pgmq extension %s updated to %s (ALTER EXTENSION pgmq UPDATE)", from, db.PGMQVersion(t))
}

// PGMQVersion is db's pgmq extension version ("" when pgmq is the stand-in
// or absent).
func (db *DB) PGMQVersion(t testing.TB) string {
	t.Helper()
	var v string
	if err := db.Pool.QueryRow(context.Background(), `select coalesce((select extversion from pg_catalog.pg_extension where extname = 'pgmq'), '')`).Scan(&v); err != nil {
		t.Fatalf("testdb: reading the pgmq version: %v", err)
	}
	return v
}

// quoteLiteral quotes a version string as an SQL literal (ALTER EXTENSION
// takes no parameters).
func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
