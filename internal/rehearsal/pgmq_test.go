package rehearsal_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A capture taken on pgmq 1.13.1 rehearses on 1.13.1: every capture
// scenario passes on databases rebuilt at that version (the restore
// updates pgmq before it makes the queues), and the rebuilt database says
// so.
func TestLongRehearsalOnPGMQ1131(t *testing.T) {
	testdb.SkipUnlessLong(t, "the capture scenarios on a capture taken on pgmq 1.13.1, rebuilt on 1.13.1")
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	ctx := context.Background()
	src := testdb.Baseline(t)
	if _, err := scenario.Generate(ctx, src.Pool, 7); err != nil {
		t.Fatal(err)
	}
	src.UpdatePGMQ(t, testdb.PGMQNewest)
	conn := testdb.Connect(t, src.DSN)
	defer conn.Close(ctx)
	var file bytes.Buffer
	if _, err := capture.Write(ctx, conn, &file, capture.Options{}); err != nil {
		t.Fatal(err)
	}
	c, err := capture.Read(bytes.NewReader(file.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var rebuiltOn string
	r := &scenario.Runner{Server: testdb.Server(t), Parallel: 2, Logf: t.Logf,
		Baseline: func(ctx context.Context, conn *pgx.Conn) error {
			if err := c.Restore(ctx, conn); err != nil {
				return err
			}
			return conn.QueryRow(ctx, `select extversion from pg_catalog.pg_extension where extname = 'pgmq'`).Scan(&rebuiltOn)
		}}
	defer r.Close()
	results := r.Run(ctx, rehearsal.Scenarios(&rehearsal.Rehearsal{MaxLockWindow: time.Hour, MaxWait: time.Hour}))
	for _, res := range results {
		if !res.Passed {
			t.Errorf("%s failed on pgmq %s: %s", res.Name, testdb.PGMQNewest, res.Error)
		}
	}
	if rebuiltOn != testdb.PGMQNewest || len(results) == 0 {
		t.Fatalf("rebuilt on pgmq %q, %d scenarios", rebuiltOn, len(results))
	}
	t.Logf("%d capture scenarios passed on pgmq %s", len(results), rebuiltOn)
}
