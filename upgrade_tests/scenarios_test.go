package upgrade_tests

import (
	"context"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestScenarios runs every built-in scenario, each as a subtest, in
// parallel, on one runner (one baseline template) per run of the test, so
// -count=N builds a fresh template each time.
func TestScenarios(t *testing.T) {
	r := &scenario.Runner{Server: testdb.Server(t), Upgrade: upgradeFunc(), Logf: func(string, ...any) {}}
	t.Cleanup(func() { _ = r.Close() })
	for _, s := range scenario.Builtin() {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			res := r.RunOne(context.Background(), s)
			for _, n := range res.Notes {
				t.Log(n)
			}
			if !res.Passed {
				t.Fatalf("scenario %s (proves: %s) failed:\n%s", s.Name, s.Proves, res.Error)
			}
		})
	}
}
