package upgrade_test

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// From 0.14.1 to 0.16.0 (the catch-up of apply --online): the function
// statements that may run before the table locks do (file 22's six
// replacements among them; file 21's functions whose SQL bodies name the
// column its ALTER adds stay for the locks), the release reached is
// checked under the locks on the objects the plan changes and read whole
// after the commit, and the end is exactly upstream's files run in order:
// the catalog, every function's body and settings, and the ledger.
func TestApplyHopsFunctionsBeforeTheLocks(t *testing.T) {
	ctx := testCtx(t)
	db := testdb.Upstream(t, "0.14.1")
	theirs := db.Clone(t)
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	opts.To = versions.R0_16_0
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	var early []string
	for _, s := range res.Report.Statements {
		if strings.HasPrefix(s.Summary, "before the table locks: ") {
			early = append(early, s.Migration+" #"+strconv.Itoa(s.Index))
		}
	}
	// File 21's DROP of the old track_worker_function, file 22's six
	// replacements; not file 21's SQL functions (they name start_mode,
	// which its ALTER adds), not file 23's (after file 22's UPDATEs).
	want := []string{"20260607175525 #4", "20260904095427 #2", "20260904095427 #3", "20260904095427 #4",
		"20260904095427 #5", "20260904095427 #6", "20260904095427 #7"}
	if !reflect.DeepEqual(early, want) {
		t.Errorf("statements before the table locks: %v, want %v", early, want)
	}
	steps := map[string]int{}
	for i, s := range res.Report.Steps {
		steps[s.Step] = i
	}
	if !(steps[upgrade.StepHopsEarly] < steps[upgrade.StepTableLocks] && steps[upgrade.StepTableLocks] < steps[upgrade.StepHop]) {
		t.Errorf("steps out of order: %+v", res.Report.Steps)
	}
	if _, ok := steps[upgrade.StepReleaseAfter]; !ok {
		t.Errorf("no %s step: %+v", upgrade.StepReleaseAfter, res.Report.Steps)
	}
	var reached *upgrade.CheckOutcome
	for i, o := range res.Report.PostConditions {
		if o.ID == "release_reached" {
			reached = &res.Report.PostConditions[i]
		}
	}
	if reached == nil || !reached.OK || !strings.Contains(reached.Detail, "read alone") {
		t.Fatalf("release_reached: %+v", reached)
	}

	theirs.PushUpstream(t, 20, 23)
	w, err := catalog.Read(ctx, theirs.Pool, "pgflow")
	if err != nil {
		t.Fatal(err)
	}
	g, err := catalog.Read(ctx, db.Pool, "pgflow")
	if err != nil {
		t.Fatal(err)
	}
	if d := catalog.Diff(w, g); len(d) != 0 {
		t.Fatalf("catalog differs from upstream's files run in order:\n%s", strings.Join(catalog.Strings(d), "\n"))
	}
	if a, b := bodies(t, theirs), bodies(t, db); !reflect.DeepEqual(a, b) {
		t.Fatalf("function bodies differ from upstream's:\n%v\n%v", a, b)
	}
	// Ours are recorded under the user's copy's versions (pgflow install
	// renames the files <new ts>_<upstream's ts>_<name>), as push records them.
	a, b := ledgerNames(t, theirs), ledgerNames(t, db)
	if len(a) != len(b) {
		t.Fatalf("ledger differs from upstream's:\n%v\n%v", a, b)
	}
	for i := range a {
		if !strings.HasSuffix(b[i], a[i]) {
			t.Fatalf("ledger row %d: %s, upstream's files record %s", i, b[i], a[i])
		}
	}
}

// bodies: every function of schema pgflow, its source's digest, settings
// and comment.
func bodies(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	var out []string
	err := db.Pool.QueryRow(context.Background(), `
		select coalesce(array_agg(p.oid::regprocedure::text || ' ' || md5(p.prosrc) || ' ' || coalesce(p.proconfig::text, '') || ' ' ||
		       coalesce(obj_description(p.oid, 'pg_proc'), '') order by p.oid::regprocedure::text), '{}')
		  from pg_proc p where p.pronamespace = 'pgflow'::regnamespace`).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
