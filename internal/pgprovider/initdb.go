package pgprovider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
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
func initCluster(ctx context.Context, base, bin, dir, data string, owner *runAs, reuse bool, logf func(string, ...any)) error {
	cache := ""
	if reuse {
		cache = initdbCacheDir(base, bin)
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

// initdbCacheDir names the cache, in base, of one installation's initdb
// result: the binaries' directory, their size and modification time, and
// initdb's arguments, so an upgraded or different PostgreSQL never reuses it.
func initdbCacheDir(base, bin string) string {
	h := sha256.New()
	fmt.Fprintln(h, bin, strings.Join(initdbArgs, " "), os.Geteuid())
	for _, name := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(bin, name)); err == nil {
			fmt.Fprintln(h, name, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return filepath.Join(base, "pgflow-upgrade-initdb-"+hex.EncodeToString(h.Sum(nil))[:16])
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

// seededPrefix names the seeded caches in the temporary directory.
const seededPrefix = "pgflow-upgrade-seeded-"

// seedCacheDir names the seeded cache, in base, of one installation, one set of
// server settings and one seed key. The installed extensions are part of
// the name (every file of the server's extension and library directories,
// by name, size and time): a seed that ran CREATE EXTENSION is stale once
// the extension is upgraded.
func seedCacheDir(base, bin string, settings map[string]string, key string) string {
	h := sha256.New()
	fmt.Fprintln(h, initdbCacheDir(base, bin), key)
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintln(h, k, settings[k])
	}
	if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--sharedir", "--pkglibdir").Output(); err == nil {
		dirs := strings.Fields(string(out))
		if len(dirs) == 2 {
			dirs[0] = filepath.Join(dirs[0], "extension")
		}
		for _, d := range dirs {
			entries, _ := os.ReadDir(d)
			for _, e := range entries {
				if fi, err := e.Info(); err == nil {
					fmt.Fprintln(h, d, e.Name(), fi.Size(), fi.ModTime().UnixNano())
				}
			}
		}
	}
	return filepath.Join(base, seededPrefix+hex.EncodeToString(h.Sum(nil))[:16])
}

// startFromSeed fills data from the seeded cache when there is a usable one.
// Seeded caches of other keys that nobody has filled for a day are removed
// on the way: each holds a data directory.
func startFromSeed(ctx context.Context, seeded, dir, data string, owner *runAs, logf func(string, ...any)) bool {
	old, _ := filepath.Glob(filepath.Join(filepath.Dir(seeded), seededPrefix+"*"))
	for _, o := range old {
		if fi, err := os.Lstat(o); err == nil && o != seeded && time.Since(fi.ModTime()) > 24*time.Hour && usableCache(o, owner) {
			_ = os.RemoveAll(o)
		}
	}
	if !usableCache(seeded, owner) {
		return false
	}
	if err := copyTree(ctx, seeded, data, dir, owner); err != nil {
		logf("pgprovider: copying the seeded cache %s failed (%v); starting a fresh cluster", seeded, err)
		_ = os.RemoveAll(data)
		return false
	}
	return true
}
