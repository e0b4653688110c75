package migrations

import (
	"bytes"
	"errors"
	"io/fs"
	"testing"
	"testing/fstest"
)

// TestAtlasSumHasNoDrift recomputes atlas.sum from the embedded files: a
// migration edited without refreshing atlas.sum (or the reverse) fails here.
func TestAtlasSumHasNoDrift(t *testing.T) {
	want, err := ComputeSum(FS)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fs.ReadFile(FS, SumFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("atlas.sum drifted; run `make atlas-sum` after review.\nhave:\n%s\nwant:\n%s", got, want)
	}
	if err := Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestTamperedMigrationIsRefused(t *testing.T) {
	all, err := All()
	if err != nil || len(all) == 0 {
		t.Fatalf("All: %v (%d migrations)", err, len(all))
	}
	sum, _ := fs.ReadFile(FS, SumFile)
	tampered := fstest.MapFS{SumFile: {Data: sum}}
	for _, m := range all {
		tampered[m.File] = &fstest.MapFile{Data: []byte(m.SQL)}
	}
	tampered[all[0].File] = &fstest.MapFile{Data: []byte(all[0].SQL + "\n-- sneaky\ndrop table pgflow.runs;\n")}
	if err := VerifyFS(tampered); !errors.Is(err, ErrChecksumMismatch) {
		t.Fatalf("VerifyFS on a tampered file: got %v, want ErrChecksumMismatch", err)
	}
	delete(tampered, SumFile)
	if err := VerifyFS(tampered); !errors.Is(err, ErrChecksumMismatch) {
		t.Fatalf("VerifyFS without atlas.sum: got %v, want ErrChecksumMismatch", err)
	}
}

func TestFileNamesAreStrict(t *testing.T) {
	bad := fstest.MapFS{"2026_oops.sql": {Data: []byte("select 1;")}}
	if _, err := list(bad); err == nil {
		t.Fatal("a badly named migration was accepted")
	}
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if len(m.Version) != 14 || m.Name == "" {
			t.Fatalf("bad parse of %s: %+v", m.File, m)
		}
	}
}
