package cli_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestPoolerRefusesOptions: a PgBouncer with its default
// ignore_startup_parameters refuses a connection that sends options (the
// DSN's options=, as the tool's own hints suggest for statement_timeout).
// The error says that, and what to do instead, not to check the host, port
// and user.
func TestPoolerRefusesOptions(t *testing.T) {
	b := pooled(t)
	db := testdb.Baseline(t)
	ctx := context.Background()
	// The test bouncer ignores options; this one must refuse them, as
	// PgBouncer does unless told otherwise (a runtime setting of its admin
	// console).
	admin, err := session.Open(ctx, b.DSNFor("pgbouncer"), session.Raw) // the console takes nothing else
	if err != nil {
		t.Fatalf("pgbouncer's admin console: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `set ignore_startup_parameters = 'extra_float_digits'`); err != nil {
		t.Fatalf("pgbouncer: set ignore_startup_parameters: %v", err)
	}
	u, err := url.Parse(viaBouncer(t, b, db, "simple_protocol"))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-cstatement_timeout=0")
	u.RawQuery = q.Encode()

	r := clitest.Run(t, nil, "--dsn", u.String(), "audit")
	out := r.Stdout + r.Stderr
	t.Logf("exit %d: %s", r.Code, strings.TrimSpace(out))
	if r.Code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d", r.Code, cli.ExitEnvironment)
	}
	for _, w := range []string{"unsupported startup parameter: options", "refuses the startup parameter options", "ALTER ROLE", "connect to PostgreSQL directly"} {
		if !strings.Contains(out, w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	if strings.Contains(out, "check the host, port") {
		t.Error("the output gives the generic remedy (check the host, port, user ...)")
	}
}
