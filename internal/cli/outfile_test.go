package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
)

// TestCaptureOutTargets: `fixtures capture --out` writes regular files only.
// A symlink, a FIFO, a device node or a directory at the target is refused
// with exit 2 and left exactly as it was (a FIFO is never opened, so nothing
// blocks); an existing regular file is replaced only with --force; no
// temporary file is left behind.
func TestCaptureOutTargets(t *testing.T) {
	db := clitest.LegacyDB(t)
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	type target struct {
		name, want string
		make       func(path string) error
	}
	targets := []target{
		{"symlink", "symbolic link", func(p string) error { return os.Symlink(victim, p) }},
		{"dangling symlink", "symbolic link", func(p string) error { return os.Symlink(filepath.Join(dir, "nowhere"), p) }},
		{"fifo", "FIFO", func(p string) error { return unix.Mkfifo(p, 0o600) }},
		{"directory", "directory", func(p string) error { return os.Mkdir(p, 0o700) }},
		{"device", "character device", func(p string) error {
			// /dev/null's numbers (1, 3): a device node made here, never /dev's own.
			return unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3)))
		}},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tg.name, " ", "_"))
			if err := tg.make(p); err != nil {
				if tg.name == "device" && os.IsPermission(err) {
					t.Skipf("making a device node needs root: %v (the refusal is the same check as for the FIFO)", err)
				}
				t.Fatal(err)
			}
			before := lstatID(t, p)
			for _, force := range []bool{false, true} {
				args := []string{"--dsn", db.DSN, "fixtures", "capture", "--out", p}
				if force {
					args = append(args, "--force")
				}
				r := clitest.Run(t, nil, args...)
				if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, tg.want) || !strings.Contains(r.Stderr, "not a regular file") {
					t.Errorf("force=%v: exit %d, want %d naming %q\n%s%s", force, r.Code, cli.ExitUsage, tg.want, r.Stdout, r.Stderr)
				}
				if after := lstatID(t, p); after != before {
					t.Errorf("force=%v: the target changed: %s → %s", force, before, after)
				}
			}
		})
	}
	if got, _ := os.ReadFile(victim); string(got) != "precious" {
		t.Errorf("the symlink's target was written: %q", got)
	}

	t.Run("regular file", func(t *testing.T) {
		p := filepath.Join(dir, "old.gz")
		if err := os.WriteFile(p, []byte("old capture"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := clitest.Run(t, nil, "--dsn", db.DSN, "fixtures", "capture", "--out", p)
		if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, "--force") {
			t.Fatalf("without --force: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		if got, _ := os.ReadFile(p); string(got) != "old capture" {
			t.Fatalf("replaced without --force: %q", got)
		}
		r = clitest.Run(t, nil, "--dsn", db.DSN, "fixtures", "capture", "--out", p, "--force")
		if r.Code != cli.ExitOK {
			t.Fatalf("with --force: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		got, _ := os.ReadFile(p)
		fi, err := os.Lstat(p)
		if err != nil || !bytes.HasPrefix(got, []byte{0x1f, 0x8b}) || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("with --force: not a fresh gzip capture of mode 0600 (%v, %v, %q...)", err, fi.Mode(), got[:min(len(got), 8)])
		}
	})

	t.Run("failed capture keeps the old file", func(t *testing.T) {
		p := filepath.Join(dir, "kept.gz")
		if err := os.WriteFile(p, []byte("old capture"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A role that sees the schemas but may read no table: the capture
		// fails after the file was started.
		_, dsnValue := roleOn(t, db, "grant usage on schema pgflow, pgmq to %[1]s")
		r := clitest.Run(t, nil, "--dsn", dsnValue, "fixtures", "capture", "--out", p, "--force")
		t.Logf("capture without SELECT: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
		if r.Code == cli.ExitOK || r.Code == cli.ExitUsage {
			t.Fatalf("capture without SELECT: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		if got, _ := os.ReadFile(p); string(got) != "old capture" {
			t.Fatalf("a failed capture replaced the file: %q", got)
		}
	})

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

// lstatID identifies what is at p without following it: type, inode, size
// and modification time.
func lstatID(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		return "missing: " + err.Error()
	}
	st := fi.Sys().(*syscall.Stat_t)
	link, _ := os.Readlink(p)
	return fmt.Sprint(fi.Mode(), "|", link, "|", st.Ino, "|", fi.ModTime(), "|", fi.Size())
}
