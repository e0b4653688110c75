// Package migrations embeds the SQL migration of the upgrade from pgflow
// 0.16.0 to pgflow 0.17.0 and its atlas.sum, and answers whether the embedded files are
// exactly the reviewed ones.
//
// File names are atlas/Supabase style, `YYYYMMDDHHMMSS_name.sql`, so a file can
// be dropped into a `supabase/migrations` folder or applied by the atlas CLI.
// atlas.sum is computed by ariga.io/atlas's sql/migrate, byte for byte what
// `atlas migrate hash` writes; Verify recomputes it.
package migrations

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"sync"

	"ariga.io/atlas/sql/migrate"
)

//go:embed *.sql atlas.sum
var FS embed.FS

// SumFile is the name of the integrity file, as atlas names it.
const SumFile = migrate.HashFileName

// Migration is one embedded migration file.
type Migration struct {
	Version string // YYYYMMDDHHMMSS
	Name    string // e.g. pgflow_persist_queue
	File    string // file name
	SQL     string
}

// Statements splits the migration into its statements as the atlas CLI
// does. The split of a text is kept for the rest of the process: apply and
// apply --online split the same embedded file on every run, and a test run
// applies it hundreds of times.
func (m Migration) Statements() ([]*migrate.Stmt, error) {
	if v, ok := splitCache.Load(m.SQL); ok {
		return v.([]*migrate.Stmt), nil
	}
	stmts, err := migrate.Stmts(m.SQL)
	if err != nil {
		return nil, err
	}
	splitCache.Store(m.SQL, stmts)
	return stmts, nil
}

// splitCache maps a migration's text to its statements (read only once
// stored; callers must not modify them).
var splitCache sync.Map

// fileName is the strict shape of a migration file name.
var fileName = regexp.MustCompile(`^([0-9]{14})_([a-z0-9_]+)\.sql$`)

// ErrChecksumMismatch is returned by Verify when a migration file or
// atlas.sum does not match the other. It wraps atlas's own error.
var ErrChecksumMismatch = errors.New("embedded migrations do not match atlas.sum")

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	return list(FS)
}

func list(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("listing embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		if e.IsDir() || e.Name() == SumFile {
			continue
		}
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("embedded migration %q: name must be YYYYMMDDHHMMSS_name.sql", e.Name())
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("reading embedded migration %s: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: m[1], Name: m[2], File: e.Name(), SQL: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// dir loads a file system into an atlas in-memory migration directory.
func dir(fsys fs.FS) (*migrate.MemDir, error) {
	d := &migrate.MemDir{}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		if err := d.WriteFile(e.Name(), b); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// ComputeSum returns the atlas.sum content for the .sql files of fsys.
func ComputeSum(fsys fs.FS) ([]byte, error) {
	d, err := dir(fsys)
	if err != nil {
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	files, err := d.Files()
	if err != nil {
		return nil, fmt.Errorf("listing migrations: %w", err)
	}
	sum, err := migrate.NewHashFile(files)
	if err != nil {
		return nil, fmt.Errorf("hashing migrations: %w", err)
	}
	return sum.MarshalText()
}

// Verify checks the embedded files against the embedded atlas.sum.
func Verify() error { return VerifyFS(FS) }

// VerifyFS checks the .sql files of fsys against its atlas.sum, exactly as
// `atlas migrate validate` does.
func VerifyFS(fsys fs.FS) error {
	d, err := dir(fsys)
	if err != nil {
		return fmt.Errorf("loading migrations: %w", err)
	}
	if err := migrate.Validate(d); err != nil {
		return fmt.Errorf("%w: %v (recompute with `make atlas-sum` only after review)", ErrChecksumMismatch, err)
	}
	return nil
}

// Hash returns the summary hash of the embedded atlas.sum (its first line),
// which identifies this set of migrations.
func Hash() string {
	b, err := fs.ReadFile(FS, SumFile)
	if err != nil {
		return "unknown"
	}
	var sum migrate.HashFile
	if err := sum.UnmarshalText(b); err != nil {
		return "invalid"
	}
	return sum.Sum()
}
