package audit_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// plan.hops lists every hop from upstream's own 0.14.1 to the newest, the
// rows 0.15.1's CHECK would reject and the telemetry job 0.17.1 schedules;
// at the newest there is no hop.
func TestPlanHops(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	db := testdb.Upstream(t, "0.14.1")
	rep := only(t, db, audit.Options{Sample: 10}, "plan.hops")
	fs := fired(t, rep, "plan.hops", audit.Info)
	if len(fs) != 3 || fs[0].Count != 7 || len(fs[0].Samples) != 7 || !strings.Contains(fs[1].Message, "0 step_tasks rows") ||
		!strings.Contains(fs[2].Message, "pgflow_telemetry_report") || !strings.Contains(fs[2].Message, "cron.schedule is there") {
		t.Fatalf("findings: %+v", fs)
	}
	if h := fs[0].Samples[3]; h["hop"] != "0.16.0 -> 0.17.0" || !strings.Contains(h["runs"].(string), "this tool's migration") {
		t.Fatalf("hop 4: %+v", h)
	}
	newest := only(t, testdb.Upstream(t, testdb.NewestRelease), audit.Options{}, "plan.hops")
	if fs := fired(t, newest, "plan.hops", audit.Info); len(fs) != 1 || !strings.Contains(fs[0].Message, "no hop to take") {
		t.Fatalf("at the newest: %+v", fs)
	}
}
