package waitprobe_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/waitprobe"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// The probe's longest wait covers a lock held on its row, and a read-only
// probe is not held up by a row lock (its SELECT does not wait for it).
func TestProbeMeasuresTheWait(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	for _, s := range []string{
		`select pgflow.create_flow('probed')`,
		`select pgflow.add_step('probed', 'only')`,
		`select pgflow.start_flow('probed', '{}')`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	const hold = 300 * time.Millisecond
	measure := func(p *waitprobe.Probe) waitprobe.Result {
		t.Helper()
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		ready, perr := make(chan struct{}), make(chan error, 1)
		go func() { perr <- p.Run(pctx, db.DSN, ready) }()
		select {
		case <-ready:
		case err := <-perr:
			t.Fatalf("probe did not start: %v", err)
		}
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `select 1 from pgflow.step_tasks for update`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(hold)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		stop()
		if err := <-perr; err != nil {
			t.Fatal(err)
		}
		return p.Result()
	}
	rw := measure(&waitprobe.Probe{})
	if rw.Longest < hold/2 || rw.Statements < 4 || rw.Failures != 0 {
		t.Fatalf("read-write probe: %+v, want a wait of about %s", rw, hold)
	}
	ro := measure(&waitprobe.Probe{ReadOnly: true})
	if ro.Longest >= hold/2 || ro.Statements < 2 || ro.Failures != 0 {
		t.Fatalf("read-only probe: %+v, want no wait on a row lock", ro)
	}
}
