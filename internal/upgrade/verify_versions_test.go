package upgrade_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
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
			if name == versions.V0_17_1 {
				// 0.17.1 is upstream's files: its pgflow_telemetry schema too.
				db = testdb.Upstream(t, "0.17.1")
			}
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

// At 0.17.1's catalog, verify checks schema pgflow_telemetry against what
// upstream's files build and tells 0.17.1 from the endpoint fix as status
// does; a changed report() or a missing telemetry function fails.
func TestVerifyTelemetryOnUpstreamReleases(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	check := func(t *testing.T, vr *upgrade.VerifyReport, id string) upgrade.CheckOutcome {
		t.Helper()
		for _, c := range vr.Checks {
			if c.ID == id {
				return c
			}
		}
		t.Fatalf("verify has no check %s: %+v", id, vr.Checks)
		return upgrade.CheckOutcome{}
	}
	for _, tc := range []struct{ release, detail string }{
		{"0.17.1", "0.17.1 without the endpoint fix; upstream's newest is " + versions.Newest},
		{versions.Newest, versions.Newest},
	} {
		t.Run(tc.release, func(t *testing.T) {
			ctx := testCtx(t)
			db := testdb.Upstream(t, tc.release)
			vr, err := upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
			if err != nil || !vr.OK {
				t.Fatalf("verify: %v %+v", err, vr)
			}
			if c := check(t, vr, "catalog_pgflow_telemetry"); c.Detail != "equal to upstream's" {
				t.Fatalf("telemetry catalog: %+v", c)
			}
			if c := check(t, vr, "release_0_17_1"); !strings.HasPrefix(c.Detail, tc.detail) {
				t.Fatalf("release check %q, want it to begin %q", c.Detail, tc.detail)
			}
			// report() changed: not upstream's function.
			testdb.Exec(t, db.Pool, `do $$ begin execute pg_catalog.regexp_replace(pg_catalog.pg_get_functiondef('pgflow_telemetry.report()'::regprocedure),
				'AS \$function\$', 'AS $function$-- changed' || chr(10)); end $$`)
			vr, err = upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
			if err != nil || vr.OK {
				t.Fatalf("verify with a changed report(): %v, ok %v", err, vr.OK)
			}
			if c := check(t, vr, "release_0_17_1"); c.OK || !strings.Contains(c.Detail, "neither") {
				t.Fatalf("release check with a changed report(): %+v", c)
			}
			// A telemetry function gone: the schema is not upstream's.
			testdb.Exec(t, db.Pool, `drop function pgflow_telemetry.preview(date)`)
			vr, err = upgrade.Verify(ctx, testdb.Connect(t, db.DSN))
			if err != nil {
				t.Fatal(err)
			}
			if c := check(t, vr, "catalog_pgflow_telemetry"); c.OK || !strings.Contains(c.Detail, "preview") {
				t.Fatalf("telemetry catalog without preview(): %+v", c)
			}
		})
	}
}

// The embedded catalog of pgflow_telemetry is what upstream's files build.
func TestTelemetryCatalogIsUpstreams(t *testing.T) {
	db := testdb.Upstream(t, versions.Newest)
	got, err := catalog.Read(testCtx(t), db.Pool, versions.TelemetrySchema)
	if err != nil {
		t.Fatal(err)
	}
	want, err := versions.TelemetryCatalog()
	if err != nil {
		t.Fatal(err)
	}
	if d := catalog.Diff(want, got); len(d) != 0 {
		t.Fatalf("upstream's pgflow_telemetry differs from the embedded catalog:\n%s", strings.Join(catalog.Strings(d), "\n"))
	}
}
