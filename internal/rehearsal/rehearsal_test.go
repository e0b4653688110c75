package rehearsal_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture/capturetest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/junit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// TestRehearsalOnACustomizedCapture: a 0.16.0 database with the owners'
// additions (capturetest.CustomizeSQL) is captured, rebuilt into a template, and the
// rehearsal runs on it: with generous budgets every expectation holds and
// both figures are reported; with tiny budgets the two measured cases fail
// on their budget, and the others still pass.
func TestRehearsalOnACustomizedCapture(t *testing.T) {
	testdb.SkipIfShort(t, "a 0.16.0 database with the owners' additions (capturetest.CustomizeSQL) is captured, rebuilt into a template, and the...")
	ctx := context.Background()
	capturetest.DropRole(t, "w19r_capture_reader")
	src := testdb.Empty(t)
	capturetest.LoadInflight(t, src)
	if _, err := src.Pool.Exec(ctx, capturetest.CustomizeSQL); err != nil {
		t.Fatal(err)
	}
	conn := testdb.Connect(t, src.DSN)
	defer conn.Close(ctx)
	var file bytes.Buffer
	if _, err := capture.Write(ctx, conn, &file, capture.Options{IncludeSchemas: []string{"app"}}); err != nil {
		t.Fatal(err)
	}
	c, err := capture.Read(bytes.NewReader(file.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	r := &scenario.Runner{Server: testdb.Server(t), Parallel: 2, Logf: t.Logf,
		Baseline: func(ctx context.Context, conn *pgx.Conn) error { return c.Restore(ctx, conn) }}
	defer r.Close()

	generous := &rehearsal.Rehearsal{MaxLockWindow: time.Hour, MaxWait: time.Hour}
	results := r.Run(ctx, rehearsal.Scenarios(generous))
	for _, res := range results {
		if !res.Passed {
			t.Errorf("%s failed with generous budgets: %s", res.Name, res.Error)
		}
	}
	m := generous.Measured()
	if m.LockWindow <= 0 || m.OnlineTotal <= 0 || m.OnlineLongestWait <= 0 || m.StepTasks <= 0 || m.ServerVersion == "" {
		t.Errorf("measurements missing: %+v", m)
	}
	var xmlOut bytes.Buffer
	if err := junit.Write(&xmlOut, "replay", time.Now(), results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<property name="lock_window_ms"`, `<property name="lock_window_budget_ms" value="3.6e+06">`, `<property name="online_longest_wait_ms"`} {
		if !strings.Contains(xmlOut.String(), want) {
			t.Errorf("JUnit lacks %s:\n%s", want, xmlOut.String())
		}
	}

	tiny := &rehearsal.Rehearsal{MaxLockWindow: time.Nanosecond, MaxWait: time.Nanosecond}
	all := rehearsal.Scenarios(tiny)
	results = r.Run(ctx, all[:2])
	for _, res := range results {
		if res.Passed || !strings.Contains(res.Error, "exceeds the budget") {
			t.Errorf("%s with a 1ns budget: passed=%v error=%q", res.Name, res.Passed, res.Error)
		}
		over := false
		for _, x := range res.Metrics {
			over = over || x.OverBudget
		}
		if !over {
			t.Errorf("%s: no metric marked over budget: %+v", res.Name, res.Metrics)
		}
	}

	// An upgrade that changes one pre-existing row and loses one archived
	// message is caught by the digest comparison.
	broken := &scenario.Runner{Server: testdb.Server(t), Logf: t.Logf,
		Baseline: func(ctx context.Context, conn *pgx.Conn) error { return c.Restore(ctx, conn) },
		Upgrade: func(ctx context.Context, db *scenario.DB) (*outcome.Result[*upgrade.Report], error) {
			rep, err := scenario.RunApply(ctx, db)
			if err != nil {
				return rep, err
			}
			_, err = db.Pool.Exec(ctx, `update pgflow.runs set remaining_steps = remaining_steps + 1
				where run_id = (select min(run_id::text)::uuid from pgflow.runs)`)
			return rep, err
		}}
	defer broken.Close()
	res := broken.Run(ctx, all[:1])[0]
	if res.Passed || !strings.Contains(res.Error, "1 differences in pre-existing state") || !strings.Contains(res.Error, "pgflow.runs") {
		t.Errorf("a broken upgrade: passed=%v error=%q", res.Passed, res.Error)
	}
}
