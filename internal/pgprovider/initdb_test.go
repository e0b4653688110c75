package pgprovider

import (
	"os"
	"path/filepath"
	"testing"
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
