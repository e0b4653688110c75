package upgrade_tests

import (
	"context"
	"flag"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

var (
	seeds = flag.Int("seeds", 50, "how many random 0.16.0 states TestRandom upgrades (seeds 1..N; 2 with -short unless given)")
	seed  = flag.Uint64("seed", 0, "run TestRandom on this one seed only (rerun a failure)")
	// While the migration is being edited atlas.sum lags behind it; this
	// lets a developer run the scenarios anyway. Never in CI.
	noIntegrity = flag.Bool("no-integrity", false, "skip apply's atlas.sum integrity check (development only)")
)

// upgradeFunc is the upgrade the tests run: apply, optionally without the
// integrity check.
func upgradeFunc() scenario.UpgradeFunc {
	if !*noIntegrity {
		return scenario.RunApply
	}
	return func(ctx context.Context, db *scenario.DB) (*outcome.Result[*upgrade.Report], error) {
		return scenario.RunApplyWith(ctx, db, upgrade.Options{Verify: func() error { return nil }})
	}
}

// seedCount is the number of seeds a seeded test runs: the flag's value, or
// short under -short when the flag was not given (the inner loop).
func seedCount(name string, value, short int) int {
	if !testing.Short() {
		return value
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	if given {
		return value
	}
	return short
}
