package upgrade_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb/versiontest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// verify passes on upstream's 0.17.0 and on 0.17.1+ (its later migrations
// on top); on 0.17.1+ upstream's later objects are not called the user's.
func TestVerifyOnUpstream017Versions(t *testing.T) {
	for _, name := range []string{versions.V0_17_0, versions.V0_17_1} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			db := versiontest.DB(t, versions.MustLookup(name))
			vr, err := upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
			if err != nil || !vr.OK {
				t.Fatalf("verify: %v %+v", err, vr)
			}
			var detail string
			for _, c := range vr.Checks {
				if c.ID == "catalog_0_17_0" {
					detail = c.Detail
				}
			}
			if !strings.HasPrefix(detail, "equal to pgflow "+name) || strings.Contains(detail, "of your own") {
				t.Fatalf("catalog check detail: %q", detail)
			}
			// A user's own index is still named as theirs.
			if _, err := db.Pool.Exec(ctx, `create index my_runs_idx on pgflow.runs (flow_slug)`); err != nil {
				t.Fatal(err)
			}
			vr, err = upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
			if err != nil || !vr.OK {
				t.Fatalf("verify with an index of the user's: %v %+v", err, vr)
			}
			for _, c := range vr.Checks {
				if c.ID == "catalog_0_17_0" && (!strings.Contains(c.Detail, "of your own") || !strings.Contains(c.Detail, "my_runs_idx") ||
					strings.Contains(c.Detail, "idx_runs_started_at") || strings.Contains(c.Detail, "pgflow_version")) {
					t.Fatalf("catalog check detail: %q", c.Detail)
				}
			}
		})
	}
}
