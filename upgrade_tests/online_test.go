package upgrade_tests

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// apply --online is not yet retargeted at pgflow 0.17.0: its phases still
// prepare the old model's shape, which the 0.17.0 migration cannot switch
// (internal/online's own tests keep covering them on that model). Until
// it is, the online path refuses on a real 0.16.0 before changing anything,
// and every scenario runs through the transactional apply. The online
// scenario suites (every built-in scenario with --online, seeded
// interrupted runs) come back with the retargeting.
func TestOnlineRefusesUntilRetargeted(t *testing.T) {
	ctx := context.Background()
	db := testdb.Empty(t)
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	before := testdb.State(t, db.Pool)
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rep, err := online.Apply(ctx, conn, online.Options{})
	if !errors.Is(err, online.ErrNotRetargeted) || upgrade.OutcomeOf(err) != upgrade.OutcomeRefused || rep.Outcome != upgrade.OutcomeRefused {
		t.Fatalf("apply --online on 0.16.0: %v (%s), want the refusal", err, rep.Outcome)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply --online")
}
