package testdb

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
)

// DetachFromExtension takes objects out of extension ext (ALTER EXTENSION
// ... DROP) when ext is installed, so that a test can damage or drop them as
// a superuser could: PostgreSQL refuses to drop an extension's members in
// place (2BP01). On a stand-in (no extension) there is nothing to detach.
// objects are SQL object descriptions such as
// "function pgmq.set_vt(text, bigint, integer)" or "table pgmq.a_g".
func (db *DB) DetachFromExtension(t testing.TB, ext string, objects ...string) {
	t.Helper()
	ctx := context.Background()
	var installed bool
	if err := db.Pool.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_extension where extname = $1)`, ext).Scan(&installed); err != nil {
		t.Fatalf("testdb: looking for extension %s: %v", ext, err)
	}
	if !installed {
		return
	}
	for _, o := range objects {
		if _, err := db.Pool.Exec(ctx, "alter extension "+pgx.Identifier{ext}.Sanitize()+" drop "+o); err != nil {
			t.Fatalf("testdb: alter extension %s drop %s: %v", ext, o, err)
		}
	}
}

// DropCron removes pg_cron from the database, whichever it has: the real
// extension (DROP EXTENSION) or the stand-in's schema.
func (db *DB) DropCron(t testing.TB) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), `drop extension if exists pg_cron; drop schema if exists cron cascade`); err != nil {
		t.Fatalf("testdb: dropping pg_cron: %v", err)
	}
}

// LoginRole creates a login role named prefix_<random> with attrs (e.g.
// "bypassrls", or ""), runs each grant with %[1]s standing for the role's
// quoted name, and returns the role with a DSN for db as that role. When the
// test ends, the role's privileges in db are dropped, then the role.
func (db *DB) LoginRole(t testing.TB, prefix, attrs string, grants ...string) (role, dsn string) {
	t.Helper()
	return db.loginRole(t, prefix, attrs, func(name, _ string) *url.Userinfo { return url.User(name) }, "", grants)
}
