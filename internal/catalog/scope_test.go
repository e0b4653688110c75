package catalog_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A scoped read is the whole read restricted to the scope, object for
// object, and reads nothing outside it.
func TestReadScopeIsTheWholeReadRestricted(t *testing.T) {
	db := testdb.Empty(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, knownObjects+`
		create function cat.f(p integer) returns integer language sql as $$ select p $$;
		create function cat.g() returns integer language sql as $$ select 1 $$;`); err != nil {
		t.Fatal(err)
	}
	whole, err := catalog.Read(ctx, db.Pool, "cat")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []catalog.Scope{
		{Tables: []string{"child"}, Functions: []string{"f"}},
		{Tables: []string{"parent"}},
		{Functions: []string{"g", "tg"}},
		{},
	} {
		got, err := catalog.ReadScope(ctx, db.Pool, "cat", s)
		if err != nil {
			t.Fatal(err)
		}
		want := whole.Restrict(s)
		if d := catalog.Diff(want, got); len(d) > 0 {
			t.Errorf("scope %+v: differs from the whole read restricted: %v", s, catalog.Strings(d))
		}
		var fns []string
		for _, f := range got.Functions {
			fns = append(fns, f.Name+"("+f.IdentityArguments+")")
		}
		if len(got.Tables) != len(s.Tables) || len(got.CompositeTypes)+len(got.Enums)+len(got.Domains)+len(got.Views) > 0 {
			t.Errorf("scope %+v: read tables %d, types and views %d", s, len(got.Tables), len(got.CompositeTypes)+len(got.Enums)+len(got.Domains)+len(got.Views))
		}
		if s.Functions == nil && len(fns) > 0 {
			t.Errorf("scope %+v: read functions %v", s, fns)
		}
	}
	// Both overloads of f, and child's trigger and sequences, are in its scope.
	got, err := catalog.ReadScope(ctx, db.Pool, "cat", catalog.Scope{Tables: []string{"child"}, Functions: []string{"f"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Functions) != 2 || len(got.Triggers) != 1 || len(got.Sequences) != 2 {
		t.Errorf("child and f: %d functions, %d triggers, %d sequences; want 2, 1, 2", len(got.Functions), len(got.Triggers), len(got.Sequences))
	}
}

func TestScopeOf(t *testing.T) {
	s, ok := catalog.ScopeOf([]catalog.Difference{
		{Kind: catalog.KindConstraint, Table: "step_tasks", Name: "valid_status"},
		{Kind: catalog.KindColumn, Table: "worker_functions", Name: "start_mode"},
		{Kind: catalog.KindFunction, Name: "track_worker_function(function_name text)"},
		{Kind: catalog.KindFunction, Name: "track_worker_function(function_name text, start_mode text)"},
		{Kind: catalog.KindTable, Name: "step_tasks"},
		{Kind: catalog.KindPGMQ, Name: "extension_version"},
	})
	want := catalog.Scope{Tables: []string{"step_tasks", "worker_functions"}, Functions: []string{"track_worker_function"}}
	if !ok || !reflect.DeepEqual(s, want) {
		t.Errorf("ScopeOf: %+v %v, want %+v", s, ok, want)
	}
	if _, ok := catalog.ScopeOf([]catalog.Difference{{Kind: catalog.KindEnum, Name: "mood"}}); ok {
		t.Error("an enum fits no scope")
	}
}

// The prepared read of a scope is ReadScope's, and can be read again.
func TestPreparedScope(t *testing.T) {
	db := testdb.Empty(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, knownObjects); err != nil {
		t.Fatal(err)
	}
	conn := testdb.Connect(t, db.DSN)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	s := catalog.Scope{Tables: []string{"child"}, Functions: []string{"f"}}
	want, err := catalog.ReadScope(ctx, tx, "cat", s)
	if err != nil {
		t.Fatal(err)
	}
	p, ok, err := catalog.PrepareScope(ctx, tx, "cat", s)
	if err != nil || !ok {
		t.Fatalf("prepare: %v %v", ok, err)
	}
	if _, err := tx.Exec(ctx, `alter table cat.child add column note text`); err != nil {
		t.Fatal(err)
	}
	got, err := p.Read(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx, conn); err != nil {
		t.Fatal(err)
	}
	d := catalog.Diff(want, got)
	if len(d) != 1 || d[0].Kind != catalog.KindColumn || d[0].Name != "note" {
		t.Fatalf("the prepared read after a change: %v", catalog.Strings(d))
	}
	// Nothing is left behind: the statement can be prepared again.
	if _, _, err := catalog.PrepareScope(ctx, tx, "cat", s); err != nil {
		t.Fatal(err)
	}
}
