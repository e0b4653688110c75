package capture_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A capture taken on pgmq 1.13.1 restores on 1.13.1 (the rebuilt database
// is updated before its queues are made, so the messages' last_read_at has
// its column), every row and message equal; a capture of a pgmq the
// server does not offer is refused, saying what the server lacks.
func TestCaptureOnPGMQ1131(t *testing.T) {
	ctx := context.Background()
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	src := testdb.Baseline(t)
	if _, err := scenario.Generate(ctx, src.Pool, 3); err != nil {
		t.Fatal(err)
	}
	src.UpdatePGMQ(t, testdb.PGMQNewest)
	// A read on 1.13.1 fills last_read_at.
	if _, err := src.Pool.Exec(ctx, `select count(*) from pgmq.list_queues() q, lateral pgmq.read(q.queue_name, 0, 1)`); err != nil {
		t.Fatal(err)
	}
	c, err := capture.Read(bytes.NewReader(captureOf(t, src, false)))
	if err != nil {
		t.Fatal(err)
	}
	if c.Header.PGMQ != "extension "+testdb.PGMQNewest {
		t.Fatalf("header pgmq %q", c.Header.PGMQ)
	}
	dst := restored(t, c)
	if v := dst.PGMQVersion(t); v != testdb.PGMQNewest {
		t.Fatalf("restored on pgmq %s", v)
	}
	if d, _ := rowDiff(t, src, dst); len(d) > 0 {
		t.Fatalf("restored state differs from the source:\n%s", fingerprint.Format(d, 20))
	}
	var filled int
	if err := dst.Pool.QueryRow(ctx, `select count(*) from pgmq.list_queues() q, lateral (select 1 from pgmq.metrics(q.queue_name)) m`).Scan(&filled); err != nil || filled == 0 {
		t.Fatalf("queues on the restored 1.13.1: %d, %v", filled, err)
	}

	c.Header.PGMQ = "extension 1.99.0"
	empty := testdb.Empty(t)
	conn := testdb.Connect(t, empty.DSN)
	defer conn.Close(ctx)
	err = c.Restore(ctx, conn)
	if err == nil || !strings.Contains(err.Error(), "taken on pgmq 1.99.0") || !strings.Contains(err.Error(), "offers only") {
		t.Fatalf("a capture of pgmq 1.99.0: %v", err)
	}
}
