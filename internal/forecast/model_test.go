package forecast_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }

// TestModelOfFitsFixedAndPerRow: two sizes on a line give its fixed part
// and slope; one size gives a ratio; noise that would make the fixed part
// negative or the slope non-positive falls back to a line through 0.
func TestModelOfFitsFixedAndPerRow(t *testing.T) {
	cases := []struct {
		name         string
		c            forecast.Calibration
		fixed, perUS float64
		method       string
		online       bool
	}{
		{"two sizes", forecast.Calibration{StepTasks: 200_000, LockWindowMS: 2100, Points: []forecast.Point{
			{StepTasks: 40_000, LockWindowMS: 500, OnlineTotalMS: 1000}, {StepTasks: 200_000, LockWindowMS: 2100, OnlineTotalMS: 5000}}},
			100, 10, "2 sizes", true},
		{"one size", forecast.Calibration{StepTasks: 1_000_000, LockWindowMS: 8000}, 0, 8, "ratio of 1 size", false},
		{"negative fixed clamps to a line through 0", forecast.Calibration{StepTasks: 2, LockWindowMS: 1, Points: []forecast.Point{
			{StepTasks: 1000, LockWindowMS: 1}, {StepTasks: 2000, LockWindowMS: 10}}},
			0, (1000*1 + 2000*10) / (1000.0*1000 + 2000*2000) * 1000, "2 sizes", false},
		{"falling timings: the ratio of the largest", forecast.Calibration{StepTasks: 2, LockWindowMS: 1, Points: []forecast.Point{
			{StepTasks: 1000, LockWindowMS: 50}, {StepTasks: 2000, LockWindowMS: 40}}},
			0, 20, "2 sizes", false},
	}
	for _, c := range cases {
		m, err := forecast.ModelOf(c.c)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !near(m.LockWindow.FixedMS, c.fixed) || !near(m.LockWindow.PerRowUS, c.perUS) || !strings.Contains(m.Method, c.method) || (m.Online != nil) != c.online {
			t.Errorf("%s: model %+v (online %+v), want fixed %g per-row %g method %q online %v", c.name, m, m.Online, c.fixed, c.perUS, c.method, c.online)
		}
	}
	// 100 ms + 10 µs/row at 1,000,000 rows: 10.1 s; online 0 + 25 µs/row: 25 s.
	m, _ := forecast.ModelOf(cases[0].c)
	if got := m.LockWindow.At(1_000_000); got != 10100*time.Millisecond {
		t.Errorf("lock window at 1M = %s, want 10.1s", got)
	}
	if got := m.Online.At(1_000_000); got != 25*time.Second {
		t.Errorf("online at 1M = %s, want 25s", got)
	}
}

// TestEstimateRecommends: --online above the threshold, with the basis kept.
func TestEstimateRecommends(t *testing.T) {
	c := forecast.Calibration{StepTasks: 1000, LockWindowMS: 10, OnlineTotalMS: 30, MeasuredAt: time.Unix(0, 0), ServerVersion: "15"}
	b, err := forecast.BasisOf(forecast.BasisFile, "f.json", c)
	if err != nil {
		t.Fatal(err)
	}
	f := forecast.Estimate(forecast.Stats{StepTasks: 1_000_000}, b, 5*time.Second)
	if !f.Available || f.LockWindowMS != 10_000 || f.OnlineTotalMS == nil || *f.OnlineTotalMS != 30_000 || !f.RecommendOnline ||
		f.Basis.Source != "f.json" || f.Basis.Server != "15" {
		t.Fatalf("forecast %+v", f)
	}
	// 1000x the only size measured: said to be likely low.
	if f.Extrapolation != 1000 || !strings.Contains(f.Caveat, "likely low") {
		t.Fatalf("extrapolation %g, caveat %q", f.Extrapolation, f.Caveat)
	}
	f = forecast.Estimate(forecast.Stats{StepTasks: 100_000}, b, 5*time.Second)
	if f.LockWindowMS != 1000 || f.RecommendOnline || !strings.Contains(f.Recommendation, "transactional apply") || f.Caveat == "" {
		t.Fatalf("forecast %+v", f)
	}
}
