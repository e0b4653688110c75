package upgrade_tests

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestLongScenariosOnPGMQ1131 runs every built-in scenario on a 0.16.0
// baseline whose pgmq was updated to 1.13.1 before the scenario's flows
// were made: the tool's end-to-end behaviour on the newest pgmq.
func TestLongScenariosOnPGMQ1131(t *testing.T) {
	testdb.SkipUnlessLong(t, "every built-in scenario on pgflow 0.16.0 over pgmq 1.13.1")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	r := &scenario.Runner{Server: testdb.Server(t), Upgrade: upgradeFunc(), Logf: func(string, ...any) {},
		Baseline: func(ctx context.Context, conn *pgx.Conn) error {
			if _, err := fixtures.InstallEngine(ctx, conn); err != nil {
				return err
			}
			_, err := conn.Exec(ctx, `alter extension pgmq update to '`+testdb.PGMQNewest+`'`)
			return err
		}}
	t.Cleanup(func() { _ = r.Close() })
	t.Logf("pgmq: real extension, updated to %s in the baseline template", testdb.PGMQNewest)
	for _, s := range scenario.Builtin() {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			res := r.RunOne(context.Background(), s)
			if !res.Passed {
				t.Fatalf("scenario %s (proves: %s) failed on pgmq %s:\n%s", s.Name, s.Proves, testdb.PGMQNewest, res.Error)
			}
		})
	}
}
