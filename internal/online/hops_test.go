package online_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// apply --online follows the plan: from upstream's own 0.16.0 with work in
// flight, the online phases and then, in the switch, this tool's hop and
// upstream's files 25-27 from the user's copy; the end is the newest
// release's catalog, with the rows and messages upstream's own files
// leave, and all 27 files in the ledger.
func TestOnlineHopsFrom0160ToNewest(t *testing.T) { onlineToNewest(t, "0.16.0") }

// The same from every release users sit at.
func TestLongOnlineHopsFromEveryRelease(t *testing.T) {
	testdb.SkipUnlessLong(t, "apply --online from upstream's 0.14.1, 0.17.0 and 0.17.1 (work in flight) ends at the newest release")
	for _, from := range []string{"0.14.1", "0.17.0", "0.17.1"} {
		t.Run(from, func(t *testing.T) { onlineToNewest(t, from) })
	}
}

func onlineToNewest(t *testing.T, release string) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	ctx := context.Background()
	db := testdb.Upstream(t, release)
	rel, err := versions.LookupRelease(release)
	if err != nil {
		t.Fatal(err)
	}
	if err := fixtures.LoadInflightRuns(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	theirs := db.Clone(t)
	res, err := online.Upgrade(ctx, testdb.Connect(t, db.DSN), online.Options{BatchSize: 50,
		Switch: upgrade.Options{PgflowMigrations: testdb.PgflowInstalledCopy(t, 27)}})
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("online: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	sw := res.Report.Switch
	if sw == nil || sw.Report.VersionNow != versions.Newest {
		t.Fatalf("switch: %+v", sw)
	}
	// Under the switch's locks the post-conditions read what the plan
	// changes alone; the whole catalog is read after the commit.
	for _, o := range sw.Report.PostConditions {
		if (o.ID == "catalog_0_17_0" || o.ID == "release_reached") && !strings.Contains(o.Detail, "read alone") {
			t.Errorf("switch post-condition %s read the whole catalog under the locks: %s", o.ID, o.Detail)
		}
	}
	// The migration file's own LOCK statements find apply's locks held and
	// are not sent.
	held := 0
	for _, s := range sw.Report.Statements {
		if strings.HasPrefix(s.Summary, "held already") {
			held++
		}
	}
	if sw.Report.Plan.Has(upgrade.HopOwn) && held != 5 {
		t.Errorf("switch: %d of the file's 5 LOCK statements found held", held)
	}
	if !slices.ContainsFunc(sw.Report.Steps, func(s upgrade.StepTiming) bool { return s.Step == upgrade.StepReleaseAfter }) {
		t.Errorf("switch: no %s step: %+v", upgrade.StepReleaseAfter, sw.Report.Steps)
	}
	theirs.PushUpstream(t, rel.Files, 27)
	// The telemetry schema's functions (made before the switch's table
	// locks) have upstream's bodies, settings and comments. (Schema
	// pgflow's bodies are this tool's own hop's text, not file 24's: the
	// catalog and the rows above are what is compared there.)
	if a, b := functionBodies(t, theirs), functionBodies(t, db); !slices.Equal(a, b) {
		var only []string
		for _, x := range a {
			if !slices.Contains(b, x) {
				only = append(only, "upstream's: "+x)
			}
		}
		for _, x := range b {
			if !slices.Contains(a, x) {
				only = append(only, "ours: "+x)
			}
		}
		t.Fatalf("function bodies differ from upstream's files run in order:\n%s", strings.Join(only, "\n"))
	}
	for _, schema := range []string{"pgflow", "pgflow_telemetry"} {
		w, err := catalog.Read(ctx, theirs.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		g, err := catalog.Read(ctx, db.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		if d := catalog.Diff(w, g); len(d) != 0 {
			t.Fatalf("schema %s differs from upstream's newest:\n%s", schema, strings.Join(catalog.Strings(d), "\n"))
		}
	}
	want := theirs.Fingerprint(t)
	got := db.Fingerprint(t)
	if d := append(fingerprint.Compare(want, got), fingerprint.Added(want, got)...); len(d) != 0 {
		t.Fatalf("rows or messages differ from upstream's own files run in order:\n%s", fingerprint.Format(d, 20))
	}
	var ledger int
	if err := db.Pool.QueryRow(ctx, `select count(*)::int from supabase_migrations.schema_migrations`).Scan(&ledger); err != nil || ledger != 27 {
		t.Fatalf("ledger: %d rows (%v)", ledger, err)
	}
}

// functionBodies: every function of schema pgflow_telemetry, its source's
// digest, settings and comment.
func functionBodies(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	var out []string
	err := db.Pool.QueryRow(context.Background(), `
		select coalesce(array_agg(p.oid::regprocedure::text || ' ' || md5(p.prosrc) || ' ' || coalesce(p.proconfig::text, '') || ' ' ||
		       coalesce(obj_description(p.oid, 'pg_proc'), '') order by p.oid::regprocedure::text), '{}')
		  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
		 where n.nspname = 'pgflow_telemetry'`).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
