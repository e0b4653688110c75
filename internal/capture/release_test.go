package capture_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// A database of upstream's own files at a release a plan starts from,
// with work in flight, is captured with its release and rebuilt as it
// was: the same catalog (pgflow, and pgflow_telemetry from 0.17.1 on), the
// same rows and messages, the same release detected, the Supabase ledger
// recording the same files.
func TestCaptureOfUpstreamReleases(t *testing.T) {
	ctx := context.Background()
	for _, rel := range []string{versions.R0_14_1, versions.R0_17_0, versions.R0_17_1} {
		t.Run(rel, func(t *testing.T) {
			src := testdb.Upstream(t, rel)
			if err := fixtures.LoadInflightRuns(ctx, src.Pool); err != nil {
				t.Fatal(err)
			}
			want, err := versions.LookupRelease(rel)
			if err != nil {
				t.Fatal(err)
			}
			c, err := capture.Read(bytes.NewReader(captureOf(t, src, false)))
			if err != nil {
				t.Fatal(err)
			}
			h := c.Header
			if h.Release == nil || h.Release.Files != want.Files || h.Release.LedgerFiles != want.Files || h.Release.Name != versions.StateName(want.Files) {
				t.Fatalf("header release %+v, want %d files (%s), the ledger recording them", h.Release, want.Files, rel)
			}
			if n, err := h.PlanStart(); err != nil || n != want.Files {
				t.Fatalf("PlanStart: %d, %v", n, err)
			}
			schemas := []string{"pgflow"}
			if want.Files >= 26 {
				schemas = append(schemas, "pgflow_telemetry")
			}
			if strings.Join(h.Schemas, ",") != strings.Join(schemas, ",") {
				t.Fatalf("captured schemas %v, want %v", h.Schemas, schemas)
			}
			dst := restored(t, c)
			sameCatalogs(t, src, dst, schemas...)
			if d, rows := rowDiff(t, src, dst); len(d) > 0 || rows == 0 {
				t.Errorf("rebuilt rows differ (%d rows in the source):\n%s", rows, fingerprint.Format(d, 20))
			}
			d, err := versions.Detect(ctx, dst.Pool)
			if err != nil {
				t.Fatal(err)
			}
			if d.Release == nil || d.Release.Files != want.Files || d.Release.LedgerFiles != want.Files || !d.PlanStarts() {
				t.Fatalf("the rebuilt copy is detected as %s (release %+v), want %s with its ledger, a plan starting", d.Summary(), d.Release, rel)
			}
		})
	}
}

// Upstream's newest release has no plan to rehearse: capture refuses it,
// saying so and what the database is.
func TestCaptureRefusesNewest(t *testing.T) {
	ctx := context.Background()
	src := testdb.Upstream(t, versions.Newest)
	conn, err := session.Open(ctx, src.DSN, session.Test)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var file bytes.Buffer
	_, err = capture.Write(ctx, conn, &file, capture.Options{})
	if !errors.Is(err, capture.ErrNoPlan) || !strings.Contains(err.Error(), "nothing to do") {
		t.Fatalf("capture of upstream's newest: %v", err)
	}
}

// Which headers a rehearsal's plan starts from, and the refusals of the
// others (no database: the header alone decides).
func TestCapturePlanStart(t *testing.T) {
	newest := len(versions.UpstreamFiles())
	for _, c := range []struct {
		name  string
		h     capture.Header
		files int
		err   error
		says  string
	}{
		{"v1 baseline", capture.Header{Version: 1, PgflowState: "baseline"}, 23, nil, ""},
		{"v1 upgraded", capture.Header{Version: 1, PgflowState: "upgraded"}, 0, capture.ErrNotBaseline, "capture the database again"},
		{"v2 baseline, no release", capture.Header{Version: 2, PgflowState: "baseline"}, 23, nil, ""},
		{"v2 older, no release", capture.Header{Version: 2, PgflowState: "older", PgflowVersion: "0.14.x"}, 0, capture.ErrNoPlan, "records no release"},
		{"v2 0.14.1", capture.Header{Version: 2, PgflowState: "older", Release: &capture.Release{Files: 20, Name: "0.14.1", LedgerFiles: -1}}, 20, nil, ""},
		{"v2 0.17.0", capture.Header{Version: 2, PgflowState: "upgraded", Release: &capture.Release{Files: 24, Name: "0.17.0", LedgerFiles: 24}}, 24, nil, ""},
		{"v2 newest", capture.Header{Version: 2, PgflowState: "upgraded", Release: &capture.Release{Files: newest, Name: versions.Newest}}, 0, capture.ErrNoPlan, "nothing to rehearse"},
	} {
		n, err := c.h.PlanStart()
		if n != c.files || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.says)) {
			t.Errorf("%s: PlanStart %d, %v; want %d, %v (saying %q)", c.name, n, err, c.files, c.err, c.says)
		}
	}
}
