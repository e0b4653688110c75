package migrations

import (
	"errors"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// FuzzFileNames feeds list (the parser behind All) a directory holding one
// fuzzed file name: a name is either refused with an error naming the
// expected shape, or parsed into a Version of exactly 14 digits and a Name
// that together spell the file name back. Nothing panics.
func FuzzFileNames(f *testing.F) {
	for _, s := range []string{
		"20261202120000_pgflow_persist_queue.sql",
		"2026_oops.sql",
		"20261202120000_.sql",
		"20261202120000_Upper.sql",
		"20261202120000_name.SQL",
		"20261202120000_name.sql.bak",
		"020261202120000_name.sql",
		"20261202120000-name.sql",
		"20261202120000_name with space.sql",
		"20261202120000_naïve.sql",
		"../20261202120000_escape.sql",
		"20261202120000_name.sql\n",
		"atlas.sum",
	} {
		f.Add(s)
	}
	strict := regexp.MustCompile(`^[0-9]{14}_[a-z0-9_]+\.sql$`)
	f.Fuzz(func(t *testing.T, name string) {
		if !fs.ValidPath(name) || strings.Contains(name, "/") || name == "." {
			t.Skip("not a file name in a flat directory")
		}
		fsys := fstest.MapFS{name: {Data: []byte("select 1;\n")}}
		got, err := list(fsys)
		if name == SumFile {
			if err != nil || len(got) != 0 {
				t.Fatalf("atlas.sum is not a migration: %v %v", got, err)
			}
			return
		}
		if err != nil {
			if strict.MatchString(name) {
				t.Fatalf("a well-formed name %q was refused: %v", name, err)
			}
			if !strings.Contains(err.Error(), "YYYYMMDDHHMMSS_name.sql") {
				t.Fatalf("the error for %q does not say the expected shape: %v", name, err)
			}
			return
		}
		if !strict.MatchString(name) || len(got) != 1 {
			t.Fatalf("%q accepted (%d migrations) though it is not YYYYMMDDHHMMSS_name.sql", name, len(got))
		}
		m := got[0]
		if len(m.Version) != 14 || m.Version+"_"+m.Name+".sql" != name || m.File != name || m.SQL != "select 1;\n" {
			t.Fatalf("%q parsed as %+v", name, m)
		}
	})
}

// FuzzVerifyFS feeds the integrity check a migration and an atlas.sum that
// are fuzzed around the real ones: it never panics, and whatever it is given
// it accepts only a sum that matches the files exactly.
func FuzzVerifyFS(f *testing.F) {
	all, err := All()
	if err != nil || len(all) == 0 {
		f.Fatalf("All: %v (%d)", err, len(all))
	}
	m := all[0]
	// The sum of the embedded file as atlas computes it (not the embedded
	// atlas.sum, which TestAtlasSumHasNoDrift checks).
	sum, err := ComputeSum(fstest.MapFS{m.File: {Data: []byte(m.SQL)}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(m.SQL, string(sum))
	f.Add(m.SQL+"\n-- sneaky\n", string(sum))
	f.Add(m.SQL, "")
	f.Add(m.SQL, "h1:garbage\n")
	f.Add("", string(sum))
	f.Add(m.SQL, strings.Replace(string(sum), "h1:", "h2:", 1))
	f.Fuzz(func(t *testing.T, sql, sumText string) {
		fsys := fstest.MapFS{m.File: {Data: []byte(sql)}, SumFile: {Data: []byte(sumText)}}
		err := VerifyFS(fsys)
		want, cerr := ComputeSum(fstest.MapFS{m.File: {Data: []byte(sql)}})
		if cerr != nil {
			t.Fatalf("ComputeSum: %v", cerr)
		}
		if err == nil {
			// Accepted: the sum must be the one atlas computes (modulo the
			// trailing newline atlas itself tolerates).
			if strings.TrimSpace(sumText) != strings.TrimSpace(string(want)) {
				t.Fatalf("VerifyFS accepted a sum that is not the files' sum:\n%q\nwant\n%q", sumText, want)
			}
			return
		}
		if !errors.Is(err, ErrChecksumMismatch) {
			t.Fatalf("VerifyFS error %v is not ErrChecksumMismatch", err)
		}
		if sumText == string(want) {
			t.Fatalf("the files' own sum was refused: %v", err)
		}
	})
}
