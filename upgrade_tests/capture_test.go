package upgrade_tests

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestCaptureReplay: the in-flight state plus a random one, captured,
// restored into a template and replayed with every capture scenario.
func TestCaptureReplay(t *testing.T) {
	testdb.SkipIfShort(t, "the in-flight state plus a random one, captured, restored into a template and replayed...")
	ctx := context.Background()
	src := testdb.Empty(t)
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(ctx, src.Pool); err != nil {
		t.Fatal(err)
	}
	if _, err := scenario.Generate(ctx, src.Pool, 11); err != nil {
		t.Fatal(err)
	}
	conn := testdb.Connect(t, src.DSN)
	defer conn.Close(ctx)
	var file bytes.Buffer
	if _, err := capture.Write(ctx, conn, &file, capture.Options{}); err != nil {
		t.Fatal(err)
	}
	c, err := capture.Read(&file)
	if err != nil {
		t.Fatal(err)
	}
	r := &scenario.Runner{Server: testdb.Server(t), Upgrade: upgradeFunc(),
		Baseline: func(ctx context.Context, conn *pgx.Conn) error { return c.Restore(ctx, conn) }}
	t.Cleanup(func() { _ = r.Close() })
	for _, res := range r.Run(ctx, rehearsal.CaptureScenarios()) {
		for _, n := range res.Notes {
			t.Logf("%s: %s", res.Name, n)
		}
		if !res.Passed {
			t.Errorf("%s failed:\n%s", res.Name, res.Error)
		}
	}
}
