package upgrade_tests

import (
	"context"
	"sync"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

var (
	runnerOnce sync.Once
	runner     *scenario.Runner
)

// sharedRunner is one runner (one baseline template) for the whole binary.
func sharedRunner(t *testing.T) *scenario.Runner {
	t.Helper()
	runnerOnce.Do(func() {
		runner = &scenario.Runner{Server: testdb.Server(t), Upgrade: upgradeFunc(), Logf: func(string, ...any) {}}
	})
	return runner
}

// TestScenarios runs every built-in scenario, each as a subtest, in parallel.
func TestScenarios(t *testing.T) {
	r := sharedRunner(t)
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
