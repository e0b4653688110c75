package preflight_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// The owner (here a superuser) passes; a role that can read and write the
// rows but owns nothing is told exactly what it lacks.
func TestPrivileges(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	f, err := preflight.Privileges(ctx, db.Pool, 5)
	if err != nil || len(f) != 0 {
		t.Fatalf("owner: %v %+v", err, f)
	}

	_, writer := db.PasswordRole(t, "h_upg_writer", "Writer-pw-1b9c",
		`grant usage on schema pgflow, pgmq to %[1]s`,
		`grant select, insert, update, delete on all tables in schema pgflow to %[1]s`)
	conn := testdb.Connect(t, writer)
	f, err = preflight.Privileges(ctx, conn, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 1 || f[0].Severity != audit.Blocker || f[0].CheckID != preflight.PrivilegesCheckID {
		t.Fatalf("writer role: %+v", f)
	}
	problems := map[string]bool{}
	for _, s := range f[0].Samples {
		problems[fmt.Sprint(s["problem"], " ", s["object"])] = true
	}
	for _, want := range []string{"not the owner of table pgflow.step_tasks", "not the owner of table pgflow.flows",
		"no CREATE privilege on schema pgflow", "not the owner of function pgflow.start_tasks(text,bigint[],uuid)"} {
		if !problems[want] {
			t.Errorf("missing %q in %v", want, problems)
		}
	}
	if int(f[0].Count) != len(f[0].Samples) || !strings.Contains(f[0].Message, "pgflow.") {
		t.Fatalf("count %d, samples %d, message %q", f[0].Count, len(f[0].Samples), f[0].Message)
	}
	// The sample bound holds; the count stays exact.
	g, err := preflight.Privileges(ctx, conn, 2)
	if err != nil || len(g) != 1 || len(g[0].Samples) != 2 || g[0].Count != f[0].Count {
		t.Fatalf("bounded samples: %v %+v", err, g)
	}
}

// Run adds the privileges check to the catalog's preflight checks and
// leaves the caller's transaction usable; a case-only alias is a blocker.
func TestRunInCallersTransaction(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	if _, err := db.Pool.Exec(ctx, `insert into pgflow.flows (flow_slug) values ('Foo'), ('foo');
		select pgmq.create('Foo')`); err != nil {
		t.Fatal(err)
	}
	conn := testdb.Connect(t, db.DSN)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	res, err := preflight.Run(ctx, tx, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range res.Checks {
		ids[c.ID] = true
	}
	if !ids[preflight.PrivilegesCheckID] || len(res.Checks) < 2 {
		t.Fatalf("checks run: %v", ids)
	}
	if res.OK() || len(res.Blockers()) == 0 {
		t.Fatalf("case aliases not a blocker: %s", res.Summary())
	}
	alias := false
	for _, b := range res.Blockers() {
		alias = alias || (b.CheckID == "flows.case_alias" && len(b.Samples) == 1 && fmt.Sprint(b.Samples[0]["flow_slugs"]) == "Foo, foo")
	}
	if !alias {
		t.Fatalf("no flows.case_alias blocker naming Foo, foo: %+v", res.Blockers())
	}
	// The transaction is still usable.
	var one int
	if err := tx.QueryRow(ctx, `select 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("transaction after preflight: %v", err)
	}
	if !strings.Contains(res.Summary(), "blocker") {
		t.Fatalf("summary %q", res.Summary())
	}
}
