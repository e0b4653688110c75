// Command atlassum rewrites migrations/atlas.sum from the .sql files next to
// it, with ariga.io/atlas's sql/migrate (the same file `atlas migrate hash`
// writes). Run it through `make atlas-sum`, after a migration was reviewed.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

func main() {
	dir := "migrations"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	sum, err := migrations.ComputeSum(os.DirFS(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "atlassum:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(filepath.Join(dir, migrations.SumFile), sum, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "atlassum:", err)
		os.Exit(1)
	}
}
