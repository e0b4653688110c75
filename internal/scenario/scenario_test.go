package scenario_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func TestSelect(t *testing.T) {
	all := scenario.Builtin()
	got, err := scenario.Select(all, []string{"state-survival", "clean-upgrade"})
	if err != nil || len(got) != 2 || got[0].Name != "state-survival" {
		t.Fatalf("Select: %v %v", got, err)
	}
	if _, err := scenario.Select(all, []string{"nope"}); err == nil || !strings.Contains(err.Error(), "clean-upgrade") {
		t.Fatalf("unknown name: %v", err)
	}
	seen := map[string]bool{}
	for _, s := range append(all, rehearsal.CaptureScenarios()...) {
		if s.Name == "" || s.Proves == "" || s.Run == nil || seen[s.Name] {
			t.Errorf("scenario %q: incomplete or duplicate", s.Name)
		}
		seen[s.Name] = true
	}
}

// The generator must reach every kind of state over a few seeds.
func TestGenerateCoversEveryKind(t *testing.T) {
	testdb.SkipIfShort(t, "The generator must reach every kind of state over a few seeds")
	ctx := context.Background()
	total := scenario.Census{}
	for seed := uint64(1); seed <= 8; seed++ {
		db := testdb.Baseline(t)
		if _, err := scenario.Generate(ctx, db.Pool, seed); err != nil {
			t.Fatal(err)
		}
		c, err := scenario.TakeCensus(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range c {
			total[k] += v
		}
	}
	for _, k := range []string{"run started", "run completed", "run failed", "task queued", "task started", "task retried",
		"task completed", "task failed", "map step with >= 3 tasks", "message visible", "message invisible", "message archived"} {
		if total[k] == 0 {
			t.Errorf("8 seeds never generated %q (got %s)", k, total)
		}
	}
}
