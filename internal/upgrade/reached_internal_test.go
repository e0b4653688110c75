package upgrade

import (
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The release reached, checked by scope: a read that is the reached
// release's objects passes, with objects of the user's own too; one that
// is still the start release's, or keeps an object the plan removes, or
// lacks one it adds, does not.
func TestScopeDifferences(t *testing.T) {
	s, _ := versions.CatalogOf(20)
	r, _ := versions.CatalogOf(23)
	if s.Name != versions.V0_14 || r.Name != versions.V0_16_0 {
		t.Fatalf("CatalogOf: %s, %s", s.Name, r.Name)
	}
	scope, ok := catalog.ScopeOf(catalog.Diff(s.Catalog, r.Catalog))
	if !ok || scope.Empty() {
		t.Fatalf("scope of 0.14.1 -> 0.16.0: %+v %v", scope, ok)
	}
	t.Logf("0.14.1 -> 0.16.0 changes tables %v, functions %v", scope.Tables, scope.Functions)
	sc := &scoped{s: s, t: r, scope: scope, wantS: s.Catalog.Restrict(scope), wantT: r.Catalog.Restrict(scope)}
	reached := r.Catalog.Restrict(scope)
	if bad := scopeDifferences(sc, reached); len(bad) > 0 {
		t.Fatalf("0.16.0's own objects: %v", bad)
	}
	users := reached.Clone()
	users.Functions = append(users.Functions, catalog.Function{Name: scope.Functions[0], IdentityArguments: "x integer", Kind: "function"})
	users.Tables[0].Indexes = append(users.Tables[0].Indexes, catalog.Index{Name: "my_index", Definition: "CREATE INDEX my_index ON ..."})
	if bad := scopeDifferences(sc, users); len(bad) > 0 {
		t.Fatalf("with the user's own function and index: %v", bad)
	}
	if bad := scopeDifferences(sc, s.Catalog.Restrict(scope)); len(bad) == 0 {
		t.Fatal("0.14.1's objects pass as 0.16.0's")
	}
	// 0.16.0's objects plus one 0.14.1 has and 0.16.0 lacks (a function
	// the plan drops).
	var left *catalog.Function
	for _, f := range s.Catalog.Restrict(scope).Functions {
		if r.Catalog.Function(f.Name, f.IdentityArguments) == nil {
			left = &f
			break
		}
	}
	if left == nil {
		t.Fatal("0.16.0 drops no function of 0.14.1's")
	}
	kept := reached.Clone()
	kept.Functions = append(kept.Functions, *left)
	if bad := scopeDifferences(sc, kept); len(bad) != 1 || !strings.Contains(bad[0], "still there") {
		t.Fatalf("%s(%s) left behind: %v", left.Name, left.IdentityArguments, bad)
	}
	lacking := reached.Clone()
	lacking.Functions = lacking.Functions[1:]
	if bad := scopeDifferences(sc, lacking); len(bad) == 0 {
		t.Fatal("a function 0.16.0 has, missing, passes")
	}
}

// The SQL post-conditions run as one statement; when it fails, each runs
// on its own, the failing one is reported with its error, the others
// answer, and the transaction goes on.
func TestSQLChecksAtOnceFallBack(t *testing.T) {
	ctx := context.Background()
	db := testdb.Empty(t)
	conn := testdb.Connect(t, db.DSN)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	checks := []PostCondition{
		{ID: "a", SQL: `select true, 'fine'`},
		{ID: "b", SQL: `select 1 / 0 = 1, 'never'`},
		{ID: "c", SQL: `select false, 'no'`},
	}
	for _, set := range [][]PostCondition{checks, {checks[0], checks[2]}} {
		out, err := runPostConditions(ctx, tx, true, set)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]CheckOutcome{}
		for _, o := range out {
			got[o.ID] = o
		}
		if len(out) != len(set) || !got["a"].OK || got["a"].Detail != "fine" || got["c"].OK || got["c"].Detail != "no" {
			t.Fatalf("outcomes: %+v", out)
		}
		if b, ok := got["b"]; ok && (b.OK || !strings.Contains(b.Detail, "query failed")) {
			t.Fatalf("the failing check: %+v", b)
		}
	}
	var one int
	if err := tx.QueryRow(ctx, `select 1`).Scan(&one); err != nil {
		t.Fatalf("the transaction after the checks: %v", err)
	}
}
