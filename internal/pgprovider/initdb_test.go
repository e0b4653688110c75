package pgprovider

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// A data directory in the shared temporary directory is used only when
// nobody but the cluster's user could have written it.
func TestInitdbCacheMustBePrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	if usableCache(dir, nil) {
		t.Fatal("a missing directory was taken as a cache")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if usableCache(dir, nil) {
		t.Error("a directory without PG_VERSION (an incomplete copy) was taken as a cache")
	}
	if err := os.WriteFile(filepath.Join(dir, "PG_VERSION"), []byte("15\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !usableCache(dir, nil) {
		t.Error("a private, complete directory of this user was refused")
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if usableCache(dir, nil) {
		t.Error("a directory others may read or write was taken as a cache")
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if usableCache(link, nil) {
		t.Error("a symbolic link was followed")
	}
	other := &runAs{uid: ownerUID(nil) + 1}
	if usableCache(dir, other) {
		t.Error("a directory owned by another user than the cluster's was taken as a cache")
	}
}

// A seed runs once per key: the next cluster starts from the seeded copy
// with what Fill built, without running it; a Fill that fails leaves no
// cache and says it was the seeding.
func TestSeedRunsOncePerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four clusters (make test runs it): a seed runs once per key")
	}
	ctx := context.Background()
	bin, err := FindBinDir()
	if err != nil {
		t.Skip(err)
	}
	key := RandomName("seed_test")
	t.Cleanup(func() { _ = os.RemoveAll(seedCacheDir(os.TempDir(), bin, nil, key)) })
	fills := 0
	seed := &Seed{Key: key, Fill: func(ctx context.Context, s *Server) error {
		fills++
		return s.CreateDatabase(ctx, "seeded_db", "")
	}}
	for i := 0; i < 2; i++ {
		s, err := Open(ctx, Options{SkipDocker: true, ReuseInitdb: true, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := session.Open(ctx, s.AdminDSN(), session.Admin)
		if err != nil {
			s.Close()
			t.Fatal(err)
		}
		var has bool
		err = conn.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_database where datname = 'seeded_db')`).Scan(&has)
		conn.Close(ctx)
		s.Close()
		if err != nil || !has {
			t.Fatalf("cluster %d: the seeded database is missing (%v)", i+1, err)
		}
	}
	if fills != 1 {
		t.Errorf("Fill ran %d times for two clusters of one key, want once", fills)
	}
	owner, err := unprivilegedUser()
	if err != nil {
		t.Fatal(err)
	}
	if !usableCache(seedCacheDir(os.TempDir(), bin, nil, key), owner) {
		t.Fatal("no usable seeded cache after a seeded cluster")
	}

	failing := &Seed{Key: RandomName("seed_test_failing"), Fill: func(context.Context, *Server) error { return errors.New("boom") }}
	t.Cleanup(func() { _ = os.RemoveAll(seedCacheDir(os.TempDir(), bin, nil, failing.Key)) })
	if s, err := Open(ctx, Options{SkipDocker: true, ReuseInitdb: true, Seed: failing}); err == nil {
		s.Close()
		t.Fatal("a failing seed gave a cluster")
	} else if !strings.Contains(err.Error(), "seeding") || !strings.Contains(err.Error(), "boom") {
		t.Errorf("error %q does not say the seeding failed and why", err)
	}
	if usableCache(seedCacheDir(os.TempDir(), bin, nil, failing.Key), owner) {
		t.Error("a failed seed left a cache behind")
	}
}
