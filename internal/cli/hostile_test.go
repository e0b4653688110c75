package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Hostile identifiers: slugs are limited by pgflow.is_valid_slug (0.17.0's
// rule) to a letter, then letters, digits and single underscores, ending
// in a letter or digit, 1..128 characters (and not "run"), and a flow's
// queue name (lower(slug)) by pgmq to 47 characters. Within those limits every
// spelling must go through audit, apply, status and verify: mixed case
// (pgmq's table is q_<lower(slug)>), SQL reserved words, underscores, digits,
// the longest lengths. Values (run inputs) and command arguments carry
// quotes and SQL fragments. The generator is seeded; a failure names its seed.

var reservedWords = []string{"select", "order", "user", "table", "from", "where", "group", "limit", "default", "null", "true", "end", "desc", "all", "Select", "ORDER", "uSeR"}

// hostileSlug returns a valid slug of at most maxLen characters; with
// exact > 0, exactly that long.
func hostileSlug(r *rand.Rand, maxLen, exact int) string {
	// pgflow 0.17.0's slug rule: a letter first, a letter or digit last,
	// no double underscore (hostile in case, length and reserved words).
	const first = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	const rest = first + "_0123456789"
	var b strings.Builder
	if exact == 0 && r.IntN(3) == 0 {
		w := reservedWords[r.IntN(len(reservedWords))]
		if r.IntN(2) == 0 {
			return w // the bare word
		}
		b.WriteString(w)
	} else {
		b.WriteByte(first[r.IntN(len(first))])
	}
	n := exact
	if n == 0 {
		n = b.Len() + r.IntN(12)
	}
	for b.Len() < n {
		b.WriteByte(rest[r.IntN(len(rest))])
	}
	s := b.String()
	if len(s) > maxLen {
		s = s[:maxLen]
	}
	for strings.Contains(s, "__") {
		s = strings.Replace(s, "__", "_x", 1)
	}
	if strings.HasSuffix(s, "_") {
		s = s[:len(s)-1] + "z"
	}
	if s == "run" {
		s = "run1"
	}
	return s
}

const hostileInput = `{"note": "it's \"quoted\"; drop table pgflow.flows; --", "Ünïcødé": "x', 'y", "$1": "select"}`

// hostileState builds flows with hostile slugs (distinct case-insensitively)
// on db, each with two steps and a started run. It returns the flow slugs.
func hostileState(t *testing.T, db *testdb.DB, seed uint64) []string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	ctx := context.Background()
	seen := map[string]bool{}
	var flows []string
	for i := 0; len(flows) < 4; i++ {
		exact := 0
		switch i {
		case 0:
			exact = 47 // the longest queue name pgmq accepts
		case 1:
			exact = 1
		}
		slug := hostileSlug(r, 47, exact)
		if seen[strings.ToLower(slug)] {
			continue
		}
		seen[strings.ToLower(slug)] = true
		s1 := hostileSlug(r, 128, 128) // the longest step slug
		s2 := hostileSlug(r, 128, 0)
		if s2 == s1 {
			s2 += "_2"
		}
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`select pgflow.create_flow($1)`, []any{slug}},
			{`select pgflow.add_step($1, $2)`, []any{slug, s1}},
			{`select pgflow.add_step($1, $2, array[$3])`, []any{slug, s2, s1}},
			{`select count(*) from pgflow.start_flow($1, $2::jsonb)`, []any{slug, hostileInput}},
		} {
			if _, err := db.Pool.Exec(ctx, q.sql, q.args...); err != nil {
				t.Fatalf("seed %d: %s %q: %v", seed, q.sql, q.args, err)
			}
		}
		flows = append(flows, slug)
	}
	return flows
}

func TestHostileIdentifiersThroughEveryCommand(t *testing.T) {
	testdb.SkipIfShort(t, "every identifier shape through every command")
	t.Parallel() // long and self-contained: overlaps the package's other long tests
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			db := testdb.Baseline(t)
			flows := hostileState(t, db, seed)
			t.Logf("flows: %q", flows)
			dsnValue := withPassword(t, db.DSN)

			r := clitest.Run(t, nil, "--dsn", dsnValue, "--format", "json", "audit")
			var doc privilegeDoc
			if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
				t.Fatalf("audit: exit %d, no JSON: %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
			}
			for _, c := range doc.Checks {
				if c.Status == "error" || c.Status == "inconclusive" {
					t.Errorf("audit check %s: %s %s", c.ID, c.Status, c.Error)
				}
			}
			if doc.Summary.Blockers != 0 {
				t.Errorf("audit found %d blockers in a valid database:\n%s", doc.Summary.Blockers, r.Stdout)
			}
			if r.Code != cli.ExitOK {
				t.Fatalf("audit: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			for _, args := range [][]string{{"apply", "--yes"}, {"status"}, {"verify"}, {"apply", "--yes"}} {
				r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
				if r.Code != cli.ExitOK || strings.Contains(r.Stdout+r.Stderr, secretPassword) {
					t.Fatalf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
				}
			}
			// The naming rule held for every spelling: the queue is
			// lower(slug) for steps and tasks, and pgmq still lists it.
			var bad int
			if err := db.Pool.QueryRow(context.Background(), `
				select (select count(*) from pgflow.steps where queue_name is distinct from lower(flow_slug))
				     + (select count(*) from pgflow.step_tasks where queue_name is distinct from lower(flow_slug))
				     + (select count(*) from pgflow.steps s where not exists (select 1 from pgmq.list_queues() q where lower(q.queue_name) = s.queue_name))`).Scan(&bad); err != nil || bad != 0 {
				t.Fatalf("%d rows break the naming rule (%v)", bad, err)
			}
			// The audit of the upgraded database still runs every check.
			if r := clitest.Run(t, nil, "--dsn", dsnValue, "audit"); r.Code != cli.ExitOK {
				t.Fatalf("audit after apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// TestHostileCaseAliasesAndLengths: the edges that must be refused are,
// with the offending names spelled exactly: case-only aliases with reserved
// words, and a flow row whose 128-character slug can have no pgmq queue (pgmq
// stops at 47, and the would-be table name q_<slug> is past Postgres's 63
// byte identifier limit, where a lookup that does not check the length
// would silently match a truncated name).
func TestHostileCaseAliasesAndLengths(t *testing.T) {
	db := testdb.Baseline(t)
	long := strings.Repeat("Order_", 22)[:128]
	db.Exec(t,
		`select pgflow.create_flow('select')`, `select pgflow.add_step('select', 'from')`,
		`select pgflow.create_flow('SELECT')`, `select pgflow.add_step('SELECT', 'from')`,
		// The engine would refuse this flow (no queue can exist for it); it
		// is inserted directly, as a hand-edited database might hold it.
		`insert into pgflow.flows (flow_slug) values ('`+long+`')`,
		// With a step: a stepless long-slug flow would be only a warning.
		`insert into pgflow.steps (flow_slug, step_slug) values ('`+long+`', 's')`)
	before := testdb.State(t, db.Pool)
	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "audit", "--sample", "10")
	if r.Code != cli.ExitFindings {
		t.Fatalf("audit: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{"flows.case_alias", `"SELECT, select"`, "pgmq.flow_queue_missing", long} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("the audit does not name %q:\n%s", want, r.Stdout)
		}
	}
	r = clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "flows.case_alias") || !strings.Contains(r.Stdout, "flows.queue_name_too_long") {
		t.Fatalf("apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "refused apply with hostile names")
}

// TestHostileArguments: SQL fragments, quotes and spaces in arguments are
// names that do not exist, never SQL: a usage error, the database unchanged.
func TestHostileArguments(t *testing.T) {
	db := clitest.LegacyDB(t)
	before := testdb.State(t, db.Pool)
	for _, args := range [][]string{
		{"audit", "--check", "schema.state'; drop table pgflow.flows; --"},
		{"audit", "--check", `"schema.state"`},
		{"audit", "--check", "schema.state --check x"},
		{"audit", "--check", "SCHEMA.STATE"},
		{"fixtures", "replay", "clean-upgrade'; drop database postgres; --"},
		{"fixtures", "load", "baseline' or '1'='1"},
	} {
		r := clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_NO_DOCKER": "1"}, append([]string{"--dsn", db.DSN}, args...)...)
		if r.Code != cli.ExitUsage || r.Stderr == "" {
			t.Errorf("%q: exit %d, want %d with a message\n%s%s", args, r.Code, cli.ExitUsage, r.Stdout, r.Stderr)
		}
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "hostile arguments")
}

// TestHostileDatabaseName: a database whose name has quotes, a space and a
// SQL fragment is loaded, audited, upgraded and verified by name.
func TestHostileDatabaseName(t *testing.T) {
	srv := testdb.Server(t)
	ctx := context.Background()
	name := pgprovider.RandomName(`h_we"ird db'; select 1; --`)
	if err := srv.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.DropDatabase(context.Background(), name); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(srv.DSNFor("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	dsnValue := u.String()
	// `fixtures load baseline` loads the real 0.16.0 baseline by name.
	if r := clitest.Run(t, nil, "--dsn", dsnValue, "fixtures", "load", "baseline"); r.Code != cli.ExitOK {
		t.Fatalf("fixtures load baseline on database %q: exit %d\n%s%s", name, r.Code, r.Stdout, r.Stderr)
	}
	conn := testdb.Connect(t, dsnValue)
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, `select current_database()`).Scan(&db); err != nil || db != name {
		t.Fatalf("connected to %q (%v), want %q", db, err, name)
	}
	var broadcasts bool
	if err := conn.QueryRow(ctx, `select to_regclass('realtime.recorded_broadcasts') is not null`).Scan(&broadcasts); err != nil || !broadcasts {
		t.Fatalf("fixtures load baseline did not install the real baseline (%v)", err)
	}
	// Audit, upgrade to 0.17.0 and verify, by that name.
	for _, args := range [][]string{{"audit"}, {"apply", "--yes"}, {"status"}, {"verify"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
		if r.Code != cli.ExitOK {
			t.Fatalf("%v on database %q: exit %d\n%s%s", args, name, r.Code, r.Stdout, r.Stderr)
		}
	}
}
