package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The audit forecasts every hop of the plan from the release it finds: on
// upstream's own 0.14.1 the seven hops to the newest, with the rows each
// lock grows with (from the statistics); on 0.17.0 the three left, none
// holding a lock for work that grows with the rows.
func TestAuditForecastPerHop(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	for _, c := range []struct {
		release string
		hops    int
		line    string
	}{
		{"0.14.1", 7, "forecast: unavailable"},
		{"0.17.0", 3, "forecast: no hop holds a lock for work that grows with the rows"},
	} {
		t.Run(c.release, func(t *testing.T) {
			db := testdb.Upstream(t, c.release)
			db.Exec(t, `insert into pgflow.worker_functions (function_name) select 'fn-' || g from generate_series(1, 3) g
				on conflict do nothing`)
			db.Exec(t, `analyze pgflow.worker_functions`)
			env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}

			r := clitest.Run(t, env, "audit", "--format", "json")
			var rep struct {
				Forecast forecast.Forecast `json:"forecast"`
			}
			if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code == cli.ExitUsage {
				t.Fatalf("audit --format json: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
			}
			hops := rep.Forecast.Hops
			if len(hops) != c.hops || !strings.HasSuffix(hops[len(hops)-1].Hop, "-> "+versions.Newest) {
				t.Fatalf("forecast.hops: %d, want %d to %s: %+v", len(hops), c.hops, versions.Newest, hops)
			}
			if c.release == "0.14.1" {
				l := hops[0].Locks[0]
				if l.Table != "pgflow.worker_functions" || l.Rows == nil || *l.Rows != 3 {
					t.Errorf("hop 21's lock: %+v (worker_functions holds 3 analysed rows)", l)
				}
				if !hops[3].Own {
					t.Errorf("hop 4 is not this tool's own: %+v", hops[3])
				}
			}

			r = clitest.Run(t, env, "audit")
			if !strings.Contains(r.Stdout, c.line) || !strings.Contains(r.Stdout, "forecast per hop: ") {
				t.Errorf("audit: want %q and the per-hop line\n%s", c.line, r.Stdout)
			}
			r = clitest.Run(t, env, "audit", "--verbose")
			if txt := cellText(r.Stdout); !strings.Contains(txt, "per hop (") || !strings.Contains(txt, hops[0].Hop) {
				t.Errorf("audit --verbose lists no hop\n%s", r.Stdout)
			}
		})
	}
}
