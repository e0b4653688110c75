package testdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ariga.io/atlas/sql/migrate"
	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
)

// Upstream databases: pgflow as upstream's own migration files build it.
//
// The files are read from the vendored copy next to the repository
// (<repo>/../shared/vendor/pgflow-migrations, a test dependency like the
// vendored pgmq; never copied into the repository). Each file runs in its
// own transaction with its row in the Supabase ledger, as `supabase db push`
// runs them, on pgmq (the real extension where the server offers it) and
// the project's Supabase stand-ins. Upstream's files need pg_net and
// pg_cron >= 1.5 (a schedule of "15 seconds"): the stand-ins of
// fixtures/sql stand for both, each registered as an extension row in
// pg_catalog.pg_extension (pg_cron in schema cron, pg_net in schema net) so
// that upstream's CREATE EXTENSION IF NOT EXISTS statements find them.
//
// A template per file count is built on first use and cloned per test.

// tplUpstreamPrefix begins the kind of an upstream template: "upstream-24"
// holds upstream's first 24 files.
const tplUpstreamPrefix = "upstream-"

// NewestRelease is the newest release the vendored files hold.
const NewestRelease = "0.17.1-endpoint-fix"

// The versions the extension rows of the stand-ins claim: the releases
// Supabase ships, which upstream's files are written for.
const (
	standInCronVersion = "1.6"
	standInNetVersion  = "0.14.0"
	standInPGMQVersion = "1.5.1"
)

// PgflowMigrationsDir returns the vendored upstream pgflow migrations
// folder (the one holding migrations/ and atlas.sum/). A missing folder
// fails the test, saying where it was looked for.
func PgflowMigrationsDir(t testing.TB) string {
	t.Helper()
	dir, err := pgflowMigrationsDir()
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return dir
}

var (
	vendorOnce sync.Once
	vendorDir  string
	vendorErr  error
)

func pgflowMigrationsDir() (string, error) {
	vendorOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			vendorErr = err
			return
		}
		root := wd
		for {
			if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(root)
			if parent == root {
				vendorErr = fmt.Errorf("upstream pgflow migrations: no go.mod above %s to find the repository root", wd)
				return
			}
			root = parent
		}
		dir := filepath.Join(filepath.Dir(root), "shared", "vendor", "pgflow-migrations")
		if _, err := os.Stat(filepath.Join(dir, "atlas.sum", NewestRelease+".atlas.sum")); err != nil {
			vendorErr = fmt.Errorf("upstream pgflow migrations not found: looked for %s (with migrations/ and atlas.sum/%s.atlas.sum): %w",
				dir, NewestRelease, err)
			return
		}
		vendorDir = dir
	})
	return vendorDir, vendorErr
}

// UpstreamFile is one of upstream's migration files in the vendored copy.
type UpstreamFile struct {
	Name string // as upstream names it: <14-digit version>_<name>.sql
	Hash string // its atlas.sum line's hash (h1, chained)
	Path string
}

// Version is the file's 14-digit prefix, the Supabase ledger's key.
func (f UpstreamFile) Version() string { v, _, _ := strings.Cut(f.Name, "_"); return v }

// Title is the file's name without version and extension, the ledger's name.
func (f UpstreamFile) Title() string {
	_, n, _ := strings.Cut(strings.TrimSuffix(f.Name, ".sql"), "_")
	return n
}

// UpstreamReleaseFiles returns the files of one release, in order, as its
// vendored atlas.sum lists them (the sum file's own checksum verified).
func UpstreamReleaseFiles(t testing.TB, release string) []UpstreamFile {
	t.Helper()
	files, err := releaseFiles(release)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return files
}

func releaseFiles(release string) ([]UpstreamFile, error) {
	dir, err := pgflowMigrationsDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "atlas.sum", release+".atlas.sum")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("upstream release %s: %w", release, err)
	}
	var sum migrate.HashFile
	if err := sum.UnmarshalText(b); err != nil {
		return nil, fmt.Errorf("upstream release %s: reading %s: %w", release, path, err)
	}
	out := make([]UpstreamFile, len(sum))
	for i, l := range sum {
		out[i] = UpstreamFile{Name: l.N, Hash: l.H, Path: filepath.Join(dir, "migrations", l.N)}
	}
	return out, nil
}

// Upstream returns a fresh database at one of upstream's releases (a name
// of the vendored atlas.sum folder: "0.14.1", "0.16.0", "0.17.0",
// "0.17.1", "0.17.1-endpoint-fix"), built from its files.
func Upstream(t testing.TB, release string) *DB {
	t.Helper()
	files := UpstreamReleaseFiles(t, release)
	return UpstreamPrefix(t, len(files))
}

// UpstreamPrefix returns a fresh database holding upstream's first n
// files: every prefix of upstream's history is a state a user can be at
// (21 and 22 are the 0.15.0 and 0.15.1 releases).
func UpstreamPrefix(t testing.TB, n int) *DB {
	t.Helper()
	all := UpstreamReleaseFiles(t, NewestRelease)
	if n < 1 || n > len(all) {
		t.Fatalf("testdb: upstream prefix of %d files: upstream has 1 to %d", n, len(all))
	}
	tpl := template(t, tplUpstreamPrefix+strconv.Itoa(n))
	return cloneOf(t, tpl.name, true)
}

// upstreamKind reports the file count of an upstream template kind.
func upstreamKind(kind string) (int, bool) {
	s, ok := strings.CutPrefix(kind, tplUpstreamPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// fillUpstream builds upstream's first n files into the database of conn,
// which becomes the template called name.
func fillUpstream(ctx context.Context, conn *pgx.Conn, n int, name string, info *templateInfo) error {
	all, err := releaseFiles(NewestRelease)
	if err != nil {
		return err
	}
	install := fixtures.InstallPGMQ
	if os.Getenv(envPGMQStandIn) == "1" {
		install = fixtures.InstallPGMQStandIn
	}
	if info.pgmq, err = install(ctx, conn); err != nil {
		return err
	}
	if err := fixtures.InstallSupabaseStubs(ctx, conn); err != nil {
		return err
	}
	// The stubs fill the ledger for the 0.16.0 fixture; here it holds what
	// push writes for the files run below, nothing else.
	if _, err := conn.Exec(ctx, `delete from supabase_migrations.schema_migrations`); err != nil {
		return fmt.Errorf("emptying the Supabase ledger: %w", err)
	}
	rows := [][3]string{{"pg_cron", "cron", standInCronVersion}, {"pg_net", "net", standInNetVersion}}
	if info.pgmq == fixtures.PGMQStandIn {
		rows = append(rows, [3]string{"pgmq", "pgmq", standInPGMQVersion})
	}
	for _, r := range rows {
		if err := registerStandIn(ctx, conn, r[0], r[1], r[2]); err != nil {
			return err
		}
	}
	info.cron = fixtures.CronStandIn
	for _, f := range all[:n] {
		if err := pushFile(ctx, conn, f); err != nil {
			return err
		}
	}
	// The jobs name the database they run in: the template's own name
	// (each clone renames them to its own).
	if _, err := conn.Exec(ctx, `update cron.job set database = $1 where database = pg_catalog.current_database()`, name); err != nil {
		return fmt.Errorf("naming the template in its cron jobs: %w", err)
	}
	return nil
}

// registerStandIn records a stand-in as extension ext in schema, so that
// CREATE EXTENSION IF NOT EXISTS ext finds it. The row owns no objects:
// the stand-in's objects stay plain ones. pg_nextoid gives each row an
// unused oid (superuser only, as writing pg_extension is).
func registerStandIn(ctx context.Context, conn *pgx.Conn, ext, schema, version string) error {
	tag, err := conn.Exec(ctx, `
		insert into pg_catalog.pg_extension (oid, extname, extowner, extnamespace, extrelocatable, extversion)
		select pg_catalog.pg_nextoid('pg_catalog.pg_extension', 'oid', 'pg_catalog.pg_extension_oid_index'),
		       $1::text::pg_catalog.name, r.oid, n.oid, false, $3::text
		  from pg_catalog.pg_namespace n, pg_catalog.pg_roles r
		 where n.nspname = $2::text and r.rolname = current_user
		   and not exists (select 1 from pg_catalog.pg_extension e where e.extname = $1::text::pg_catalog.name)`,
		ext, schema, version)
	if err != nil {
		return fmt.Errorf("registering the %s stand-in as an extension: %w", ext, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("registering the %s stand-in as an extension: schema %s missing or %s already installed", ext, schema, ext)
	}
	return nil
}

// pushFile runs one upstream file in its own transaction with its ledger
// row, as `supabase db push` does.
func pushFile(ctx context.Context, conn *pgx.Conn, f UpstreamFile) error {
	sql, err := os.ReadFile(f.Path)
	if err != nil {
		return fmt.Errorf("reading upstream's %s: %w", f.Name, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, string(sql)); err != nil {
		return fmt.Errorf("applying upstream's %s: %w", f.Name, err)
	}
	if _, err := pgflowfiles.RecordApplied(ctx, tx, f.Version(), f.Title(), string(sql)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing upstream's %s: %w", f.Name, err)
	}
	return nil
}

// UpstreamComponents says what an upstream database was built on, for the
// test's log.
func UpstreamComponents() string {
	pgmq := "real pgmq extension"
	if os.Getenv(envPGMQStandIn) == "1" || PGMQKindInUse() == fixtures.PGMQStandIn {
		pgmq = "the pgmq stand-in (registered as extension pgmq " + standInPGMQVersion + ")"
	}
	return fmt.Sprintf("upstream pgflow files from the vendored copy, each in its own transaction; %s; "+
		"pg_cron and pg_net: the project's stand-ins registered as extensions (pg_cron %s, pg_net %s)",
		pgmq, standInCronVersion, standInNetVersion)
}

// PgflowInstalledCopy returns a folder holding upstream's first n files as
// `npx pgflow install` leaves them in a project's supabase/migrations:
// renamed <new timestamp>_<original name>, next to an application's own
// migration. The files are copied from the vendored folder into the
// test's temporary directory (removed when the test ends).
func PgflowInstalledCopy(t testing.TB, n int) string {
	t.Helper()
	all := UpstreamReleaseFiles(t, NewestRelease)
	if n < 0 || n > len(all) {
		t.Fatalf("testdb: installed copy of %d files: upstream has %d", n, len(all))
	}
	dir := t.TempDir()
	for i, f := range all[:n] {
		b, err := os.ReadFile(f.Path)
		if err != nil {
			t.Fatalf("testdb: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, InstalledName(i, f.Name)), b, 0o600); err != nil {
			t.Fatalf("testdb: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "20260101000000_app.sql"), []byte("-- the application's own migration\n"), 0o600); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return dir
}

// InstalledName is the name PgflowInstalledCopy gives upstream's file i
// (0-based) called name.
func InstalledName(i int, name string) string { return fmt.Sprintf("2027010100%04d_%s", i, name) }

// PushUpstream runs upstream's files from+1..to on db as `supabase db push`
// does (each in its own transaction with its ledger row): the reference a
// test compares an upgrade of a copy of db with. It returns how long each
// file's transaction took, begin to commit (its locks are held that long).
func (db *DB) PushUpstream(t testing.TB, from, to int) []time.Duration {
	t.Helper()
	var took []time.Duration
	ctx := context.Background()
	all := UpstreamReleaseFiles(t, NewestRelease)
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer conn.Close(ctx)
	for _, f := range all[from:to] {
		start := time.Now()
		if err := pushFile(ctx, conn, f); err != nil {
			t.Fatalf("testdb: %v", err)
		}
		took = append(took, time.Since(start))
	}
	return took
}
