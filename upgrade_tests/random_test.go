package upgrade_tests

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestRandom upgrades random 0.16.0 states (seeds 1..-seeds, or just -seed):
// every pre-existing row and queue message must survive, the new columns
// must hold the right values, and the new worker must drain every run that
// can finish.
func TestRandom(t *testing.T) {
	n := seedCount("seeds", *seeds, 2)
	list := make([]uint64, 0, n)
	if *seed != 0 {
		list = append(list, *seed)
	} else {
		for s := 1; s <= n; s++ {
			list = append(list, uint64(s))
		}
	}
	up := upgradeFunc()
	for _, s := range list {
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Parallel()
			if err := randomSeed(t, up, s); err != nil {
				t.Fatalf("seed %d: %v\nrerun: go test ./upgrade_tests -run TestRandom -seed %d", s, err, s)
			}
		})
	}
}

func randomSeed(t *testing.T, up scenario.UpgradeFunc, s uint64) error {
	ctx := context.Background()
	tdb := testdb.Baseline(t)
	db := &scenario.DB{Name: tdb.Name, DSN: tdb.DSN, Pool: tdb.Pool}
	g, err := scenario.Generate(ctx, db.Pool, s)
	if err != nil {
		return err
	}
	census, err := scenario.TakeCensus(ctx, db.Pool)
	if err != nil {
		return err
	}
	t.Logf("%d flows; %s", len(g.Flows), census)
	before, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	if _, err := up(ctx, db); err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	if d := fingerprint.Compare(before, after); len(d) > 0 {
		return fmt.Errorf("%d differences after the upgrade:\n%s", len(d), fingerprint.Format(d, 20))
	}
	d, err := fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		return err
	}
	if len(d) > 0 {
		return fmt.Errorf("new columns wrong:\n%s", fingerprint.Format(d, 20))
	}
	rep, err := scenario.Drain(ctx, db, scenario.DrainOptions{FastForward: true})
	if err != nil {
		return err
	}
	var open int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.runs where status = 'started'`).Scan(&open); err != nil {
		return err
	}
	if open != len(rep.Stuck) {
		return fmt.Errorf("%d runs still started after the drain, %d of them stuck by design (%s)", open, len(rep.Stuck), strings.Join(rep.Stuck, ", "))
	}
	return nil
}
