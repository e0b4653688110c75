package cli_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
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

	if r := clitest.Run(t, env, "apply", "--yes", "--telemetry", "maybe", "--pgflow-migrations", dir); r.Code != cli.ExitUsage {
		t.Fatalf("--telemetry maybe: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, env, "apply", "--yes", "--to", "0.16.0"); r.Code != cli.ExitUsage || !strings.Contains(r.Stdout+r.Stderr, "0.17.0 or later") {
		t.Fatalf("--to 0.16.0: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	r := clitest.Run(t, env, "apply", "--yes", "--pgflow-migrations", dir)
	out := r.Stdout
	if r.Code != cli.ExitOK || !strings.Contains(out, "now "+versions.Newest) ||
		!strings.Contains(out, "plan: 0.17.0 -> "+versions.Newest+" (3 hops") ||
		!strings.Contains(out, "3. 0.17.1 without the endpoint fix -> "+versions.Newest) ||
		!strings.Contains(out, "telemetry: upstream's default") {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, out, r.Stderr)
	}
	r = clitest.Run(t, env, "status")
	if r.Code != cli.ExitOK || !strings.Contains(cellText(r.Stdout), "nothing to do") {
		t.Fatalf("status after: exit %d\n%s", r.Code, r.Stdout)
	}
}
