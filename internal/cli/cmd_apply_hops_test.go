package cli_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// apply on upstream's own 0.17.0 with the user's copy of upstream's files
// prints the plan hop by hop and ends at the newest release; --telemetry
// takes only off or on.
func TestApplyPlanToNewest(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	db := testdb.Upstream(t, "0.17.0")
	env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}
	dir := testdb.PgflowInstalledCopy(t, 27)

	if r := run(t, env, "apply", "--yes", "--telemetry", "maybe", "--pgflow-migrations", dir); r.code != cli.ExitUsage {
		t.Fatalf("--telemetry maybe: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, env, "apply", "--yes", "--to", "0.16.0"); r.code != cli.ExitUsage || !strings.Contains(r.stdout+r.stderr, "0.17.0 or later") {
		t.Fatalf("--to 0.16.0: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r := run(t, env, "apply", "--yes", "--pgflow-migrations", dir)
	out := r.stdout
	if r.code != cli.ExitOK || !strings.Contains(out, "now "+versions.Newest) ||
		!strings.Contains(out, "plan: 0.17.0 -> "+versions.Newest+" (3 hops") ||
		!strings.Contains(out, "3. 0.17.1 without the endpoint fix -> "+versions.Newest) ||
		!strings.Contains(out, "telemetry: upstream's default") {
		t.Fatalf("apply: exit %d\n%s%s", r.code, out, r.stderr)
	}
	r = run(t, env, "status")
	if r.code != cli.ExitOK || !strings.Contains(cellText(r.stdout), "nothing to do") {
		t.Fatalf("status after: exit %d\n%s", r.code, r.stdout)
	}
}
