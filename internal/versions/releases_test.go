package versions_test

import (
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The hash lines of upstreamHistory are every shipped release's atlas.sum: each
// release is the prefix of the newest's lines its Files says.
func TestReleasesAreTheirAtlasSums(t *testing.T) {
	all := versions.UpstreamFiles()
	for _, r := range versions.Releases {
		if !r.Shipped {
			continue
		}
		files := testdb.UpstreamReleaseFiles(t, r.Name)
		if len(files) != r.Files {
			t.Errorf("%s: atlas.sum lists %d files, Releases says %d", r.Name, len(files), r.Files)
			continue
		}
		for i, f := range files {
			if all[i].Name != f.Name || all[i].Hash != f.Hash {
				t.Errorf("%s line %d: vendored %s h1:%s, embedded %s h1:%s", r.Name, i+1, f.Name, f.Hash, all[i].Name, all[i].Hash)
			}
		}
	}
	if n := len(all); n != versions.Releases[len(versions.Releases)-1].Files {
		t.Errorf("embedded %d hash lines, the newest release has %d files", n, versions.Releases[len(versions.Releases)-1].Files)
	}
	for n, want := range map[int]string{20: "0.14.1", 21: "0.15.0", 24: "0.17.0", 25: "upstream's first 25 files (after 0.17.0)",
		26: "0.17.1 without the endpoint fix", 27: "0.17.1-endpoint-fix"} {
		if got := versions.StateName(n); got != want {
			t.Errorf("StateName(%d) = %q, want %q", n, got, want)
		}
	}
}
