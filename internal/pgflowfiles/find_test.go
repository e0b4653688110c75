package pgflowfiles_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// installed copies the vendored files into a folder as `pgflow install`
// does (<new timestamp>_<original name>), next to an application's own
// migration, and returns the folder.
func installed(t *testing.T) string {
	t.Helper()
	src := filepath.Join(testdb.PgflowMigrationsDir(t), "migrations")
	dir := t.TempDir()
	for i, f := range versions.UpstreamFiles() {
		b, err := os.ReadFile(filepath.Join(src, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("2027010100%04d_%s", i, f.Name)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "20260101000000_app.sql"), []byte("create table app.t ();\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFindRecognisesRenamedFiles(t *testing.T) {
	dir := installed(t)
	c, err := pgflowfiles.Find(dir, 27)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range c.Files {
		if f.Index != i+1 || !strings.HasSuffix(f.Path, "_"+f.Name) {
			t.Errorf("file %d: %+v", i+1, f)
		}
	}
	if _, err := c.Read(27); err != nil {
		t.Fatal(err)
	}
}

// A file renamed beyond recognition is still found by its content.
func TestFindByContentAlone(t *testing.T) {
	dir := installed(t)
	f := versions.UpstreamFiles()[25]
	old := filepath.Join(dir, fmt.Sprintf("2027010100%04d_%s", 25, f.Name))
	if err := os.Rename(old, filepath.Join(dir, "telemetry.sql")); err != nil {
		t.Fatal(err)
	}
	c, err := pgflowfiles.Find(dir, 27)
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Base(c.File(26).Path); got != "telemetry.sql" {
		t.Fatalf("file 26 found as %s", got)
	}
}

func TestFindNamesMissingAndAlteredFiles(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		dir := installed(t)
		f := versions.UpstreamFiles()[24]
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("2027010100%04d_%s", 24, f.Name))); err != nil {
			t.Fatal(err)
		}
		if _, err := pgflowfiles.Find(dir, 24); err != nil {
			t.Fatalf("the first 24 files do not need file 25: %v", err)
		}
		_, err := pgflowfiles.Find(dir, 27)
		var fe *pgflowfiles.FileError
		if !errors.As(err, &fe) || !errors.Is(err, pgflowfiles.ErrMissing) || fe.File.Name != f.Name ||
			!strings.Contains(err.Error(), f.Name) || !strings.Contains(err.Error(), "h1:"+f.Hash) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("altered", func(t *testing.T) {
		dir := installed(t)
		f := versions.UpstreamFiles()[26]
		p := filepath.Join(dir, fmt.Sprintf("2027010100%04d_%s", 26, f.Name))
		b, _ := os.ReadFile(p)
		if err := os.WriteFile(p, append(b, []byte("\n-- edited\n")...), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := pgflowfiles.Find(dir, 27)
		var fe *pgflowfiles.FileError
		if !errors.As(err, &fe) || !errors.Is(err, pgflowfiles.ErrAltered) || fe.Path != p ||
			!strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "h1:"+f.Hash) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("none", func(t *testing.T) {
		_, err := pgflowfiles.Find(t.TempDir(), 27)
		if !errors.Is(err, pgflowfiles.ErrNoCopy) {
			t.Fatalf("got %v", err)
		}
	})
}

// Statements splits upstream's files whole: dollar-quoted bodies stay in
// one statement.
func TestStatementsKeepBodiesWhole(t *testing.T) {
	stmts, err := pgflowfiles.Statements("create function f() returns int language sql as $$ select 1; $$;\nselect 2;\n")
	if err != nil {
		t.Fatal(err)
	}
	if len(stmts) != 2 || !strings.Contains(stmts[0], "select 1;") {
		t.Fatalf("%q", stmts)
	}
}
