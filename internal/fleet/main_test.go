package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// helperVar, set, makes the test binary the tool: it runs the arguments
// in helperArgs (JSON) and exits with their code, so a test can kill -9 a
// real fleet run in the middle.
const (
	helperVar  = "PGFLOW_UPGRADE_FLEET_HELPER"
	helperArgs = "PGFLOW_UPGRADE_FLEET_HELPER_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperVar) == "1" {
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv(helperArgs)), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		app := &cli.App{Stdout: os.Stdout, Stderr: os.Stderr}
		code := app.Run(ctx, append([]string{"pgflow-upgrade"}, args...))
		stop()
		os.Exit(code)
	}
	os.Exit(testdb.Main(m))
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs the tool in-process; env is all of the environment it sees.
func run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }}
	code := app.Run(context.Background(), append([]string{"pgflow-upgrade"}, args...))
	return result{code, out.String(), errOut.String()}
}

// legacy is a 0.16.0 database with flow "legacy" (one step) and one
// started run, whose task has a message in queue "legacy".
func legacy(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	db.Exec(t,
		`select pgflow.create_flow('legacy')`,
		`select pgflow.add_step('legacy', 'a')`,
		`select pgflow.start_flow('legacy', '{"i": 0}'::jsonb)`)
	return db
}

// blocked is legacy with case-only flow aliases: a blocker for 0.17.0.
func blocked(t *testing.T) *testdb.DB {
	t.Helper()
	db := legacy(t)
	db.Exec(t, `insert into pgflow.flows (flow_slug) values ('Foo'), ('foo')`)
	return db
}

// upgraded is legacy after apply.
func upgraded(t *testing.T) *testdb.DB {
	t.Helper()
	db := legacy(t)
	if r := run(t, nil, "apply", "--dsn", db.DSN, "--yes"); r.code != cli.ExitOK {
		t.Fatalf("setup: apply: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	return db
}

// unreachableDSN points at a loopback port nothing listens on.
func unreachableDSN(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://postgres@" + addr + "/nothing?connect_timeout=5"
}

const secretPassword = "Fleet-S3cret-pw"

// passwordServer starts a cluster that asks for scram-sha-256 over TCP
// (the shared test server trusts everyone) with role fleet_pw, whose
// password is "the-right-one", and returns the DSN of its postgres
// database for that role without a password.
func passwordServer(t *testing.T) *url.URL {
	t.Helper()
	if _, err := pgprovider.FindBinDir(); err != nil {
		t.Skipf("no PostgreSQL binaries to start a cluster with password authentication: %v", err)
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fleet-hba-") // t.TempDir's parent is private to us
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // the cluster's user reads it
		t.Fatal(err)
	}
	hba := filepath.Join(dir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := pgprovider.Open(ctx, pgprovider.Options{SkipDocker: true, ReuseInitdb: true, Settings: map[string]string{"hba_file": hba}})
	if err != nil {
		t.Fatalf("starting a cluster with password authentication: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	admin, err := session.Open(ctx, srv.AdminDSN(), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `create role fleet_pw login password 'the-right-one'`); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.DSNFor("postgres"))
	u.User = url.User("fleet_pw")
	return u
}

// writeTargets writes lines to a targets file only its owner reads.
func writeTargets(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "targets.txt")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// report reads a fleet's JSON report.
func report(t *testing.T, r result) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("not JSON (exit %d): %v\n%s\n%s", r.code, err, r.stdout, r.stderr)
	}
	return doc
}

// entry is the named target's entry of a JSON report.
func entry(t *testing.T, doc map[string]any, name string) map[string]any {
	t.Helper()
	for _, e := range doc["entries"].([]any) {
		if m := e.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("no entry %s in the report", name)
	return nil
}

// take fingerprints every row and message of db.
func take(t *testing.T, db *testdb.DB) *fingerprint.Fingerprint {
	t.Helper()
	fp, err := fingerprint.Take(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
