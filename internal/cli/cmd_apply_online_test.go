package cli_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// apply --online is not yet retargeted at pgflow 0.17.0 (its phases prepare
// the old model's shape; internal/online's own tests cover them on that
// model): on a real 0.16.0 it refuses before changing anything and points
// at the transactional apply. Its flag rules hold, and rollback-online has
// nothing to undo.
func TestApplyOnlineCLI(t *testing.T) {
	db := testdb.Baseline(t)
	env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}
	if r := run(t, env, "apply", "--online", "--dry-run", "--yes"); r.code != cli.ExitUsage {
		t.Fatalf("--online --dry-run: exit %d, want usage (%s)", r.code, r.stderr)
	}
	if r := run(t, env, "apply", "--online", "--rollback-online", "--yes"); r.code != cli.ExitUsage {
		t.Fatalf("--online --rollback-online: exit %d, want usage", r.code)
	}
	before := testdb.State(t, db.Pool)
	r := run(t, env, "apply", "--online", "--yes")
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout+r.stderr, "pgflow-upgrade apply") {
		t.Fatalf("apply --online on 0.16.0: exit %d, want a refusal naming the transactional apply\n%s%s", r.code, r.stdout, r.stderr)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply --online")
	if r := run(t, env, "apply", "--rollback-online", "--yes"); r.code != cli.ExitOK || !strings.Contains(r.stdout, "nothing_to_do") {
		t.Fatalf("rollback-online with nothing to undo: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, env, "apply", "--yes"); r.code != cli.ExitOK {
		t.Fatalf("the transactional apply after the refusal: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
