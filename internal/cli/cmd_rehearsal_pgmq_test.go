package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// fixtures replay --from FILE --pgmq 1.13.1: the pgmq hop rehearsed on a
// capture of 0.16.0 with upstream's mixed-case example flow and a run in
// flight: every capture scenario passes (rows and messages identical, the
// queue list changed by exactly the reported rename), the lock window is a
// JUnit property; without --from the flag is a usage error.
func TestLongRehearsalWithPGMQHop(t *testing.T) {
	testdb.SkipUnlessLong(t, "fixtures replay --from --pgmq 1.13.1 on a capture with analyzeWebsite")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	db := testdb.Baseline(t).AnalyzeWebsite(t, `select pgflow.start_flow('analyzeWebsite', '{"url": "https://example.com"}')`)
	dir := t.TempDir()
	file := filepath.Join(dir, "prod.capture.gz")
	if r := clitest.Run(t, map[string]string{}, "--dsn", db.DSN, "fixtures", "capture", "--out", file); r.Code != 0 {
		t.Fatalf("capture: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--pgmq", "1.13.1", "clean-upgrade"); r.Code != cli.ExitUsage {
		t.Fatalf("--pgmq without --from: exit %d\n%s", r.Code, r.Stderr)
	}
	junit := filepath.Join(dir, "junit.xml")
	r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", file, "--pgmq", testdb.PGMQNewest, "--junit", junit)
	if r.Code != cli.ExitOK {
		t.Fatalf("replay --pgmq: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if !strings.Contains(cellText(r.Stdout), "pgmq 1.5.1 → "+testdb.PGMQNewest+" in the same transaction: 1 queue(s), 1 pgmq.meta name(s) made to match") {
		t.Errorf("the rehearsal does not say the pgmq hop ran:\n%s", r.Stdout)
	}
	found := false
	for _, c := range readJUnit(t, junit).Suites[0].Cases {
		if c.Failure != nil {
			t.Errorf("%s failed: %s", c.Name, c.Failure.Message)
		}
		for _, p := range c.Properties {
			found = found || (p.Name == "lock_window_ms" && strings.HasPrefix(c.Name, "capture-upgrade-survives"))
		}
	}
	if !found {
		t.Fatalf("no lock_window_ms property:\n%s", r.Stdout)
	}
}
