package pgflowfiles

import (
	"crypto/sha256"
	"encoding"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Refusals (exit 1, nothing changed): the user's copy lacks a file the plan
// needs, or holds it changed.
var (
	ErrMissing = errors.New("upstream pgflow migration file missing")
	ErrAltered = errors.New("upstream pgflow migration file altered")
	ErrNoCopy  = errors.New("no upstream pgflow migration files in the folder")
)

// FileError names the file that is missing or altered and the hash it
// must have.
type FileError struct {
	Err  error // ErrMissing or ErrAltered
	Dir  string
	File versions.UpstreamFile
	Path string // the altered copy; "" when missing
}

func (e *FileError) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("%v: %s (upstream's %s) does not hash to its atlas.sum line h1:%s; restore it from pgflow's release (`npx pgflow install`) and do not edit it",
			e.Err, e.Path, e.File.Name, e.File.Hash)
	}
	return fmt.Sprintf("%v: upstream's %s (atlas.sum h1:%s) is not in %s under any name; copy pgflow's migrations there (`npx pgflow install`) or point --pgflow-migrations at a folder that has them",
		e.Err, e.File.Name, e.File.Hash, e.Dir)
}

func (e *FileError) Unwrap() error { return e.Err }

// Found is one of upstream's files, found in the user's folder.
type Found struct {
	versions.UpstreamFile
	Path string // the user's copy, under whatever name it has
}

// Copy is the user's copy of upstream's files: Files[i] is upstream's file
// i+1, for as many files as were asked for.
type Copy struct {
	Dir   string
	Files []Found
}

// File returns upstream's file n (1-based), which Find found.
func (c *Copy) File(n int) Found { return c.Files[n-1] }

// Read returns the content of a found file, checked again against its
// hash (the folder may have changed since Find).
func (c *Copy) Read(n int) (string, error) {
	f := c.File(n)
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", f.Path, err)
	}
	// The chain: files 1..n-1 as found, then this one.
	h := sha256.New()
	for _, p := range c.Files[:n-1] {
		pb, err := os.ReadFile(p.Path)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", p.Path, err)
		}
		h.Write([]byte(p.Name))
		h.Write(pb)
	}
	h.Write([]byte(f.Name))
	h.Write(b)
	if base64.StdEncoding.EncodeToString(h.Sum(nil)) != f.Hash {
		return "", &FileError{Err: ErrAltered, Dir: c.Dir, File: f.UpstreamFile, Path: f.Path}
	}
	return string(b), nil
}

// Find recognises upstream's first n files among the *.sql files of dir by
// content, whatever their names: `pgflow install` copies them as
// <new timestamp>_<original timestamp>_<name>.sql. Atlas's hashes are
// chained (each one covers every file before it, under upstream's names),
// so recognising file k needs files 1..k-1 too, as `pgflow install` copies
// them all. A file that no copy matches is ErrMissing, or ErrAltered when a
// copy under its name is there but differs (a *FileError names both and
// the hash expected). A folder holding none of upstream's files is ErrNoCopy.
func Find(dir string, n int) (*Copy, error) {
	all := versions.UpstreamFiles()
	if n < 0 || n > len(all) {
		return nil, fmt.Errorf("upstream has %d migration files, not %d", len(all), n)
	}
	candidates, err := readSQLFiles(dir)
	if err != nil {
		return nil, err
	}
	c := &Copy{Dir: dir}
	h := sha256.New()
	for _, want := range all[:n] {
		found, next, altered := match(h, want, candidates)
		if found == "" {
			if len(c.Files) == 0 && altered == "" {
				return nil, fmt.Errorf("%w: %s holds no file that hashes to upstream's %s (atlas.sum h1:%s); copy pgflow's migrations there (`npx pgflow install`) or point --pgflow-migrations at a folder that has them",
					ErrNoCopy, dir, want.Name, want.Hash)
			}
			if altered != "" {
				return nil, &FileError{Err: ErrAltered, Dir: dir, File: want, Path: altered}
			}
			return nil, &FileError{Err: ErrMissing, Dir: dir, File: want}
		}
		h = next
		delete(candidates, found)
		c.Files = append(c.Files, Found{UpstreamFile: want, Path: found})
	}
	return c, nil
}

// readSQLFiles reads every regular *.sql file of dir, by path.
func readSQLFiles(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the pgflow migrations folder: %w", err)
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		out[p] = b
	}
	return out, nil
}

// match finds the candidate that continues the chain h as want: those
// named like it first (upstream's name, or pgflow install's
// <ts>_<upstream name>), then any other. It returns the path, the chain
// after it, and a same-named copy that did not match (altered).
func match(h hash.Hash, want versions.UpstreamFile, candidates map[string][]byte) (found string, next hash.Hash, altered string) {
	var named, others []string
	for p := range candidates {
		base := filepath.Base(p)
		if base == want.Name || strings.HasSuffix(base, "_"+want.Name) {
			named = append(named, p)
		} else {
			others = append(others, p)
		}
	}
	sort.Strings(named)
	sort.Strings(others)
	state, _ := h.(encoding.BinaryMarshaler).MarshalBinary()
	for _, p := range append(named, others...) {
		try := sha256.New()
		_ = try.(encoding.BinaryUnmarshaler).UnmarshalBinary(state)
		try.Write([]byte(want.Name))
		try.Write(candidates[p])
		if base64.StdEncoding.EncodeToString(try.Sum(nil)) == want.Hash {
			return p, try, ""
		}
	}
	if len(named) > 0 {
		altered = named[0]
	}
	return "", nil, altered
}
