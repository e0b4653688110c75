package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// forecastDoc is the forecast part of the audit's JSON.
type forecastDoc struct {
	Summary struct {
		ExitCode int `json:"exit_code"`
	} `json:"summary"`
	Forecast *struct {
		Available bool   `json:"available"`
		Reason    string `json:"reason"`
		Rows      *struct {
			StepTasks  int64  `json:"step_tasks"`
			StepStates int64  `json:"step_states"`
			Runs       int64  `json:"runs"`
			Source     string `json:"source"`
		} `json:"rows"`
		Basis *struct {
			Kind       string         `json:"kind"`
			Source     string         `json:"source"`
			Server     string         `json:"server"`
			MeasuredAt time.Time      `json:"measured_at"`
			Method     string         `json:"method"`
			LockWindow forecast.Cost  `json:"lock_window"`
			Online     *forecast.Cost `json:"online"`
		} `json:"basis"`
		LockWindowMS    int64   `json:"lock_window_ms"`
		Extrapolation   float64 `json:"extrapolation"`
		Caveat          string  `json:"caveat"`
		OnlineTotalMS   *int64  `json:"online_total_ms"`
		ThresholdMS     int64   `json:"online_threshold_ms"`
		RecommendOnline bool    `json:"recommend_online"`
		Recommendation  string  `json:"recommendation"`
	} `json:"forecast"`
}

func auditForecast(t *testing.T, dsn string, args ...string) (forecastDoc, string) {
	t.Helper()
	r := clitest.Run(t, nil, append([]string{"--dsn", dsn, "--format", "json", "audit"}, args...)...)
	if r.Code != cli.ExitOK {
		t.Fatalf("audit %v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
	}
	var doc forecastDoc
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("json: %v\n%s", err, r.Stdout)
	}
	if doc.Forecast == nil {
		t.Fatalf("no forecast in the JSON:\n%s", r.Stdout)
	}
	return doc, r.Stderr
}

// knownStats gives pgflow's tables statistics the test knows: 2,000,000
// step_tasks, 4,000 step_states and 2,000 runs (superuser on the test
// server; what an ANALYZE of a large database would have written).
func knownStats(t *testing.T, db *testdb.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), `
		update pg_catalog.pg_class set reltuples = case relname when 'step_tasks' then 2000000 when 'step_states' then 4000 else 2000 end
		where relnamespace = 'pgflow'::regnamespace and relname in ('step_tasks', 'step_states', 'runs')`)
	if err != nil {
		t.Fatal(err)
	}
}

func writeCal(t *testing.T, c forecast.Calibration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "calibration.json")
	if err := forecast.WriteCalibration(path, c); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAuditForecastFromCalibrationFile: two measured sizes give a fixed and
// a per-row cost; the audit multiplies the statistics' 2,000,000 rows by
// them, and recommends --online above the threshold only.
func TestAuditForecastFromCalibrationFile(t *testing.T) {
	db := auditDB(t)
	knownStats(t, db)
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	// lock: 100 ms + 10 µs/row; online: 500 ms + 25 µs/row.
	path := writeCal(t, forecast.Calibration{Source: "test", MeasuredAt: at, ServerVersion: "15.0",
		StepTasks: 500_000, LockWindowMS: 5100, OnlineTotalMS: 13_000,
		Points: []forecast.Point{{StepTasks: 100_000, LockWindowMS: 1100, OnlineTotalMS: 3000}, {StepTasks: 500_000, LockWindowMS: 5100, OnlineTotalMS: 13_000}}})

	doc, _ := auditForecast(t, db.DSN, "--calibration", path)
	f := doc.Forecast
	if !f.Available || f.Rows == nil || f.Basis == nil {
		t.Fatalf("forecast: %+v", f)
	}
	if f.Rows.StepTasks != 2_000_000 || f.Rows.StepStates != 4000 || f.Rows.Runs != 2000 || !strings.Contains(f.Rows.Source, "reltuples") {
		t.Fatalf("rows: %+v", f.Rows)
	}
	if f.LockWindowMS != 20_100 || f.OnlineTotalMS == nil || *f.OnlineTotalMS != 50_500 {
		t.Fatalf("lock window %d ms, online %v ms: want 20100 and 50500", f.LockWindowMS, f.OnlineTotalMS)
	}
	if f.Extrapolation != 4 || f.Caveat != "" {
		t.Fatalf("2M rows from a 500k sample: extrapolation %g (want 4), caveat %q (want none)", f.Extrapolation, f.Caveat)
	}
	if !f.RecommendOnline || f.ThresholdMS != 5000 || !strings.Contains(f.Recommendation, "use apply --online") {
		t.Fatalf("recommendation: %+v", f)
	}
	if b := f.Basis; b.Kind != "calibration_file" || !strings.Contains(b.Source, path) || b.Server != "15.0" || !b.MeasuredAt.Equal(at) ||
		!strings.Contains(b.Method, "2 sizes") || b.LockWindow.FixedMS < 99.9 || b.LockWindow.FixedMS > 100.1 {
		t.Fatalf("basis: %+v", b)
	}

	// A higher threshold: the transactional apply.
	doc, _ = auditForecast(t, db.DSN, "--calibration", path, "--online-threshold", "30s")
	if doc.Forecast.RecommendOnline || doc.Forecast.ThresholdMS != 30_000 || !strings.Contains(doc.Forecast.Recommendation, "transactional apply") {
		t.Fatalf("threshold 30s: %+v", doc.Forecast)
	}

	// A rehearsal's file: one size, no --online timing: a ratio, no online estimate.
	one := writeCal(t, forecast.Calibration{Source: "rehearsal of capture x", MeasuredAt: at, StepTasks: 1_000_000, LockWindowMS: 8000})
	doc, _ = auditForecast(t, db.DSN, "--calibration", one)
	if f := doc.Forecast; !f.Available || f.LockWindowMS != 16_000 || f.OnlineTotalMS != nil || !strings.Contains(f.Basis.Method, "ratio of 1 size") {
		t.Fatalf("one size: %+v", f)
	}

	// The table states the estimate and its basis.
	r := clitest.Run(t, nil, "--dsn", db.DSN, "audit", "--calibration", path)
	if !strings.Contains(r.Stdout, "forecast: apply holds its locks about 20.1s, apply --online takes about 50.5s; use --online\n") {
		t.Errorf("the short output lacks the forecast's line:\n%s", r.Stdout)
	}
	r = clitest.Run(t, nil, "--dsn", db.DSN, "audit", "--verbose", "--calibration", path)
	for _, want := range []string{"pgflow.step_tasks about 2000000 rows", "basis: calibration file " + path, "measured 2026-12-01T10:00:00Z",
		"locks held about 20.1s", "apply --online: about 50.5s", "recommendation: use apply --online"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.Stdout)
		}
	}
}

// TestAuditForecastWithoutCostsIsUnavailable: without a source of costs,
// or with a place to measure that does not answer, the forecast says so and
// what to do; the audit's exit code is unchanged.
func TestAuditForecastWithoutCostsIsUnavailable(t *testing.T) {
	db := auditDB(t)
	knownStats(t, db)
	doc, _ := auditForecast(t, db.DSN)
	if f := doc.Forecast; f.Available || f.Rows == nil || f.Rows.StepTasks != 2_000_000 || !strings.Contains(f.Reason, "--calibration FILE") {
		t.Fatalf("no source: %+v", f)
	}
	doc, _ = auditForecast(t, db.DSN, "--calibrate-dsn", "postgres://nobody:secret-pw@127.0.0.1:1/postgres?connect_timeout=2")
	if f := doc.Forecast; f.Available || !strings.Contains(f.Reason, "sample calibration failed") || strings.Contains(f.Reason, "secret-pw") {
		t.Fatalf("unreachable place to measure: %+v", f)
	}
}

// TestAuditForecastBadCalibrationIsUsage: a calibration file that cannot
// be used, or conflicting flags, are usage errors (exit 2) that say why,
// before any connection.
func TestAuditForecastBadCalibrationIsUsage(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := writeCal(t, forecast.Calibration{StepTasks: 10, LockWindowMS: 1})
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--calibration", filepath.Join(dir, "missing.json")}, "reading the calibration file"},
		{[]string{"--calibration", file("text.json", "not json")}, "not a calibration"},
		{[]string{"--calibration", file("v9.json", `{"format": 9, "step_tasks": 10, "lock_window_ms": 1}`)}, "format 9"},
		{[]string{"--calibration", file("empty.json", `{"format": 1}`)}, "no measured lock window"},
		{[]string{"--calibration", file("neg.json", `{"format": 1, "step_tasks": 10, "lock_window_ms": 1, "points": [{"step_tasks": 5, "lock_window_ms": -1}]}`)}, "point 0"},
		{[]string{"--calibration", good, "--calibrate-local"}, "alternatives"},
		{[]string{"--calibration-out", filepath.Join(dir, "o.json")}, "only a measured sample"},
		{[]string{"--calibrate-local", "--calibrate-rows", "10,x"}, "--calibrate-rows"},
		{[]string{"--online-threshold", "0s"}, "--online-threshold"},
	}
	for _, c := range cases {
		r := clitest.Run(t, nil, append([]string{"--dsn", "postgres://nobody@127.0.0.1:1/x", "audit"}, c.args...)...)
		if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("audit %v: exit %d, stderr %q: want %d and %q", c.args, r.Code, r.Stderr, cli.ExitUsage, c.want)
		}
	}
}

// TestAuditForecastMeasuresASample: with --calibrate-dsn the costs come
// from a generated sample on a throwaway database of that server (not the
// audited one, which is left as it was); --calibration-out keeps them.
func TestAuditForecastMeasuresASample(t *testing.T) {
	testdb.SkipIfShort(t, "with --calibrate-dsn the costs come from a generated sample on a throwaway database of...")
	db := auditDB(t)
	knownStats(t, db)
	before := testdb.State(t, db.Pool)
	out := filepath.Join(t.TempDir(), "sample.json")
	doc, stderr := auditForecast(t, db.DSN, "--calibrate-dsn", testdb.Server(t).AdminDSN(), "--calibrate-rows", "2000,10000", "--calibration-out", out)
	if !strings.Contains(stderr, "names the audited database's server") {
		t.Errorf("no note that the sample runs on the audited server: %q", stderr)
	}
	f := doc.Forecast
	if !f.Available || f.Basis == nil || f.Basis.Kind != "sample" || !strings.Contains(f.Basis.Source, "sample of 2000 and 10000") ||
		f.Basis.Server == "" || time.Since(f.Basis.MeasuredAt) > time.Hour {
		t.Fatalf("forecast: %+v", f)
	}
	if f.LockWindowMS <= 0 || f.OnlineTotalMS == nil || *f.OnlineTotalMS <= 0 || f.Basis.LockWindow.PerRowUS <= 0 || f.Basis.Online.PerRowUS <= 0 {
		t.Fatalf("want positive costs: %+v %+v", f, f.Basis)
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "the audited database after a sample calibration")
	cal, err := forecast.ReadCalibration(out)
	if err != nil || len(cal.Points) != 2 {
		t.Fatalf("--calibration-out: %+v, %v", cal, err)
	}
	// The saved file gives the same estimate.
	doc, _ = auditForecast(t, db.DSN, "--calibration", out)
	if doc.Forecast.LockWindowMS != f.LockWindowMS || *doc.Forecast.OnlineTotalMS != *f.OnlineTotalMS {
		t.Fatalf("from the saved file: %+v, measured: %+v", doc.Forecast, f)
	}
}

// TestAuditForecastCalibrateLocal: --calibrate-local measures on an
// ephemeral cluster of this machine's binaries when they exist, and
// otherwise reports the forecast unavailable with what to do (the audit
// itself is unaffected either way).
func TestAuditForecastCalibrateLocal(t *testing.T) {
	testdb.SkipIfShort(t, "--calibrate-local measures on an ephemeral cluster of this machine's binaries when they exist, and...")
	db := auditDB(t)
	doc, _ := auditForecast(t, db.DSN, "--calibrate-local", "--calibrate-rows", "2000,10000")
	f := doc.Forecast
	if _, err := pgprovider.FindBinDir(); err != nil {
		if f.Available || !strings.Contains(f.Reason, "ephemeral cluster") || !strings.Contains(f.Reason, "--calibrate-dsn") {
			t.Fatalf("no binaries: %+v", f)
		}
		return
	}
	if !f.Available || f.Basis.Kind != "sample" || !strings.Contains(f.Basis.Source, "local") || f.Basis.LockWindow.PerRowUS <= 0 {
		t.Fatalf("local cluster: %+v %+v", f, f.Basis)
	}
}
