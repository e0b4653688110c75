package fleet_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// fleet apply --pgmq: every target gets the pgflow hop and the pgmq hop
// (one with upstream's mixed-case example flow, where the plain pgmq
// update fails), and the JUnit file has one passing case per target.
func TestLongFleetApplyPGMQ(t *testing.T) {
	testdb.SkipUnlessLong(t, "fleet apply --pgmq takes every target through both hops")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	mixed, plain := clitest.LegacyDB(t).AnalyzeWebsite(t), clitest.LegacyDB(t)
	targets := writeTargets(t, "mixed "+mixed.DSN, "plain "+plain.DSN)
	junit := filepath.Join(t.TempDir(), "fleet.xml")
	r := clitest.Run(t, nil, "fleet", "apply", "--yes", "--targets", targets, "--parallel", "1", "--pgmq", testdb.PGMQNewest, "--junit", junit, "--format", "json")
	doc := report(t, r)
	if r.Code != cli.ExitOK {
		t.Fatalf("fleet apply --pgmq: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for name, db := range map[string]*testdb.DB{"mixed": mixed, "plain": plain} {
		if v := db.PGMQVersion(t); v != testdb.PGMQNewest {
			t.Errorf("%s: pgmq %s (%v)", name, v, entry(t, doc, name))
		}
		if verifyCode(t, db) != cli.ExitOK {
			t.Errorf("%s: verify fails after fleet apply --pgmq", name)
		}
	}
	x, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(x), "<testcase"); n != 2 || strings.Contains(string(x), "<failure") {
		t.Fatalf("JUnit: %d cases\n%s", n, x)
	}
}
