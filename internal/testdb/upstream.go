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
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upstreamdb"
)

// Upstream databases: pgflow as upstream's own migration files build it.
//
// The files are read from the vendored copy next to the repository
// (<repo>/../shared/vendor/pgflow-migrations, a test dependency like the
// vendored pgmq; never copied into the repository). Each file runs in its
// own transaction with its row in the Supabase ledger, as `supabase db push`
// runs them, on pgmq (the real extension where the server offers it) and
// the project's Supabase stand-ins, pg_cron and pg_net stand-ins
// registered as extensions: internal/upstreamdb builds them, as it builds
// `fixtures replay --pgflow-migrations`'s databases from a user's copy.
//
// A template per file count is built on first use and cloned per test.

// tplUpstreamPrefix begins the kind of an upstream template: "upstream-24"
// holds upstream's first 24 files.
const tplUpstreamPrefix = "upstream-"

// NewestRelease is the newest release the vendored files hold.
const NewestRelease = "0.17.1-endpoint-fix"

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
	copy, err := vendoredCopy(n)
	if err != nil {
		return err
	}
	c, err := upstreamdb.Build(ctx, conn, copy, n, upstreamdb.Options{PGMQStandIn: os.Getenv(envPGMQStandIn) == "1"})
	if err != nil {
		return err
	}
	info.pgmq, info.cron = c.PGMQ, c.Cron
	// The jobs name the database they run in: the template's own name
	// (each clone renames them to its own).
	if _, err := conn.Exec(ctx, `update cron.job set database = $1 where database = pg_catalog.current_database()`, name); err != nil {
		return fmt.Errorf("naming the template in its cron jobs: %w", err)
	}
	return nil
}

// vendoredCopy is the vendored folder's first n files, as the product finds
// a user's copy.
func vendoredCopy(n int) (*pgflowfiles.Copy, error) {
	dir, err := pgflowMigrationsDir()
	if err != nil {
		return nil, err
	}
	return pgflowfiles.Find(filepath.Join(dir, "migrations"), n)
}

// UpstreamComponents says what an upstream database was built on, for the
// test's log.
func UpstreamComponents() string {
	pgmq := "real pgmq extension"
	if os.Getenv(envPGMQStandIn) == "1" || PGMQKindInUse() == fixtures.PGMQStandIn {
		pgmq = "the pgmq stand-in (registered as extension pgmq " + upstreamdb.StandInPGMQVersion + ")"
	}
	return fmt.Sprintf("upstream pgflow files from the vendored copy, each in its own transaction; %s; "+
		"pg_cron and pg_net: the project's stand-ins registered as extensions (pg_cron %s, pg_net %s)",
		pgmq, upstreamdb.StandInCronVersion, upstreamdb.StandInNetVersion)
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
	ctx := context.Background()
	copy, err := vendoredCopy(to)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer conn.Close(ctx)
	took, err := upstreamdb.Push(ctx, conn, copy, from, to)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return took
}
