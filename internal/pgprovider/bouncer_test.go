package pgprovider

import (
	"context"
	"errors"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// TestBouncerIsTransactionMode proves the harness really is a transaction-mode
// pooler (its own console says so), that SET LOCAL holds inside a transaction
// through it, and that pgx works through it with the documented settings.
func TestBouncerIsTransactionMode(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Options{SkipDocker: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b, err := StartBouncer(ctx, s)
	if errors.Is(err, ErrNoPgBouncer) {
		t.Skip("pgbouncer not installed here: the pooler tests cannot run (scripts/setup.sh installs it)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Raw sessions, unpinned on purpose: the test is about the pooler's
	// connections as any client gets them.
	c1, err := session.Open(ctx, b.DSNFor("postgres"), session.Raw)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close(ctx)
	var pidInTx1, pidInTx2 int
	tx, _ := c1.Begin(ctx)
	if _, err := tx.Exec(ctx, "set local statement_timeout = '1234ms'"); err != nil {
		t.Fatal(err)
	}
	var st string
	_ = tx.QueryRow(ctx, "show statement_timeout").Scan(&st)
	_ = tx.QueryRow(ctx, "select pg_backend_pid()").Scan(&pidInTx1)
	_ = tx.Commit(ctx)
	if st != "1234ms" {
		t.Fatalf("SET LOCAL inside a transaction did not hold through the bouncer: %q", st)
	}
	// Two clients interleaving transactions share server connections.
	c2, err := session.Open(ctx, b.DSNFor("postgres"), session.Raw)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	tx2, _ := c2.Begin(ctx)
	_ = tx2.QueryRow(ctx, "select pg_backend_pid()").Scan(&pidInTx2)
	_ = tx2.Commit(ctx)
	if pidInTx1 != pidInTx2 {
		t.Logf("different server connections (%d, %d): pool had a spare", pidInTx1, pidInTx2)
	} else {
		t.Logf("two clients were served by one server connection %d: transaction pooling", pidInTx1)
	}
	if pidInTx1 == 0 || pidInTx2 == 0 {
		t.Fatal("no backend pid read through the bouncer")
	}
	var mode string
	admin, err := session.Open(ctx, b.DSNFor("pgbouncer"), session.Raw) // the console takes nothing else
	if err != nil {
		t.Fatalf("admin console: %v", err)
	}
	defer admin.Close(ctx)
	rows, err := admin.Query(ctx, "show config")
	if err != nil {
		t.Fatalf("show config: %v", err)
	}
	for rows.Next() {
		vals, _ := rows.Values()
		if len(vals) >= 2 && vals[0] == "pool_mode" {
			mode, _ = vals[1].(string)
		}
	}
	rows.Close()
	if mode != "transaction" {
		t.Fatalf("pool_mode = %q, want transaction", mode)
	}
}
