package preflight_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := session.Open(context.Background(), dsn, session.Test)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// The owner (here a superuser) passes; a role that can read and write the
// rows but owns nothing is told exactly what it lacks.
func TestPrivileges(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	f, err := preflight.Privileges(ctx, db.Pool, 5)
	if err != nil || len(f) != 0 {
		t.Fatalf("owner: %v %+v", err, f)
	}

	role := pgprovider.RandomName("h_upg_writer")
	const password = "Writer-pw-1b9c"
	for _, s := range []string{
		fmt.Sprintf(`create role %s login password '%s'`, role, password),
		fmt.Sprintf(`grant usage on schema pgflow, pgmq to %s`, role),
		fmt.Sprintf(`grant select, insert, update, delete on all tables in schema pgflow to %s`, role),
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(ctx, `drop owned by `+role)
		if _, err := db.Pool.Exec(ctx, `drop role `+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	conn := connect(t, u.String())
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
	conn := connect(t, db.DSN)
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
