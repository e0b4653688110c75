package pgprovider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// initdbArgs make the pristine data directory every ephemeral cluster starts
// from; the server settings are given to postgres on its command line, so the
// directory initdb leaves is the same for every cluster of one installation.
var initdbArgs = []string{"-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"}

// initCluster fills data with a fresh data directory: by running initdb, or,
// with reuse, by copying the directory an earlier initdb of the same
// binaries left in the cache. initdb bootstraps the whole catalog (over a
// second of CPU); a copy of its 40 MB result takes a tenth of that, and a
// test run starts one cluster per test binary.
func initCluster(ctx context.Context, bin, dir, data string, owner *runAs, reuse bool, logf func(string, ...any)) error {
	cache := ""
	if reuse {
		cache = initdbCacheDir(bin)
		if usableCache(cache, owner) {
			err := copyTree(ctx, cache, data, dir, owner)
			if err == nil {
				return nil
			}
			logf("pgprovider: copying the initdb cache %s failed (%v); running initdb", cache, err)
			_ = os.RemoveAll(data)
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), append([]string{"-D", data}, initdbArgs...)...)
	owner.apply(initdb, dir)
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb in %s: %w: %s", data, err, strings.TrimSpace(string(out)))
	}
	if cache != "" {
		fillCache(ctx, cache, dir, data, owner)
	}
	return nil
}

// initdbCacheDir names the cache of one installation's initdb result: the
// binaries' directory, their size and modification time, and initdb's
// arguments, so an upgraded or different PostgreSQL never reuses it.
func initdbCacheDir(bin string) string {
	h := sha256.New()
	fmt.Fprintln(h, bin, strings.Join(initdbArgs, " "), os.Geteuid())
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(bin, name)); err == nil {
			fmt.Fprintln(h, name, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return filepath.Join(os.TempDir(), "pgflow-upgrade-initdb-"+hex.EncodeToString(h.Sum(nil))[:16])
}

// usableCache says whether cache is a complete data directory that only the
// cluster's user could have written: owned by that user, no symlink, no
// access for anyone else. Anything else in a shared temporary directory is
// ignored (a planted postgresql.conf would run as the cluster's user).
func usableCache(cache string, owner *runAs) bool {
	fi, err := os.Lstat(cache)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid != ownerUID(owner) {
		return false
	}
	_, err = os.Stat(filepath.Join(cache, "PG_VERSION"))
	return err == nil
}

func ownerUID(owner *runAs) uint32 {
	if owner == nil {
		return uint32(os.Geteuid())
	}
	return owner.uid
}

// fillCache copies a fresh data directory into the cache, best effort: a
// copy under a private name, then a rename, so a concurrent reader sees the
// whole directory or none (the first of two concurrent writers wins).
func fillCache(ctx context.Context, cache, dir, data string, owner *runAs) {
	tmp := filepath.Join(dir, "initdb-cache")
	if err := copyTree(ctx, data, tmp, dir, owner); err != nil {
		_ = os.RemoveAll(tmp)
		return
	}
	if err := os.Rename(tmp, cache); err != nil {
		_ = os.RemoveAll(tmp)
	}
}

// copyTree copies directory from to to (which must not exist) as the
// cluster's user, keeping modes: `cp -a`.
func copyTree(ctx context.Context, from, to, dir string, owner *runAs) error {
	cp := exec.CommandContext(ctx, "cp", "-a", from, to)
	owner.apply(cp, dir)
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
