// Package clitest is what the tests of the CLI and of the packages that
// drive it (the fleet) share: the tool run in-process (Run, RunApp), the
// databases they start from (LegacyDB, UpgradedDB), and a cluster that
// asks for a password (PasswordServer), which the shared test server,
// trusting everyone, cannot be. The binary does not import it.
package clitest

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Result is what one in-process run of the tool produced.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs the tool in-process with an isolated environment: only the
// variables in env are visible to it.
func Run(t testing.TB, env map[string]string, args ...string) Result {
	t.Helper()
	return RunApp(&cli.App{Getenv: func(k string) string { return env[k] }}, args...)
}

// RunApp runs app on args (what follows the program's name), its Stdout
// and Stderr replaced by buffers.
func RunApp(app *cli.App, args ...string) Result {
	var out, errOut bytes.Buffer
	app.Stdout, app.Stderr = &out, &errOut
	code := app.Run(context.Background(), append([]string{"pgflow-upgrade"}, args...))
	return Result{code, out.String(), errOut.String()}
}

// RightPassword is the password of PasswordServer's role.
const RightPassword = "the-right-one"

// PasswordServer starts a cluster of its own that asks for scram-sha-256
// over TCP (postgres alone is trusted there), with role, whose password is
// RightPassword, and returns the DSN of its postgres database for role,
// without a password. It skips t where there are no PostgreSQL binaries to
// start a cluster with.
func PasswordServer(t testing.TB, role string) *url.URL {
	t.Helper()
	if _, err := pgprovider.FindBinDir(); err != nil {
		t.Skipf("no PostgreSQL binaries to start a cluster with password authentication: %v", err)
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "clitest-hba-") // t.TempDir's parent is private to us
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The cluster runs as an unprivileged user when we are root: it must read the file.
	if err := os.Chmod(dir, 0o755); err != nil {
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
	// CREATE ROLE takes no parameters: the name is quoted, the password a constant.
	if _, err := admin.Exec(ctx, `create role `+pgx.Identifier{role}.Sanitize()+` login password '`+RightPassword+`'`); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.DSNFor("postgres"))
	u.User = url.User(role)
	return u
}

// LegacyDB is a 0.16.0 database with flow "legacy" (one step "a") and one
// started run, whose task has a message in queue "legacy".
func LegacyDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	db.Exec(t,
		`select pgflow.create_flow('legacy')`,
		`select pgflow.add_step('legacy', 'a')`,
		`select pgflow.start_flow('legacy', '{"i": 0}'::jsonb)`)
	return db
}

// UpgradedDB is LegacyDB after apply.
func UpgradedDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := LegacyDB(t)
	if r := Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("setup: apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	return db
}
