package calibrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/calibrate"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestMeasureSmallSample runs the sample calibration on throwaway databases
// of the test server: both sizes measured, positive timings, and a model
// with positive costs that the forecast can use.
func TestMeasureSmallSample(t *testing.T) {
	testdb.SkipIfShort(t, "runs the sample calibration on throwaway databases of the test server")
	srv := testdb.Server(t)
	c, err := calibrate.Measure(context.Background(), srv, calibrate.Options{Rows: []int64{2_000, 10_000}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Points) != 2 || c.Points[0].StepTasks != 2_000 || c.Points[1].StepTasks != 10_000 {
		t.Fatalf("points = %+v, want 2,000 and 10,000 rows", c.Points)
	}
	for _, p := range c.Points {
		if p.LockWindowMS <= 0 || p.OnlineTotalMS <= 0 {
			t.Errorf("point %+v: want positive lock window and online duration", p)
		}
	}
	if c.StepTasks != 10_000 || c.StepStates <= 0 || c.Flows != 10 || c.ServerVersion == "" || time.Since(c.MeasuredAt) > time.Hour {
		t.Errorf("calibration header = %+v", c)
	}
	m, err := forecast.ModelOf(c)
	if err != nil {
		t.Fatal(err)
	}
	if m.LockWindow.At(1_000_000) <= 0 || m.Online == nil || m.Online.At(1_000_000) <= 0 {
		t.Fatalf("model %+v: want positive costs for lock window and online", m)
	}
	if m.LockWindow.PerRowUS <= 0 || m.Online.PerRowUS <= 0 {
		t.Errorf("model %+v: want positive per-row costs", m)
	}
	// The file round-trips through the reader the audit uses.
	path := t.TempDir() + "/cal.json"
	if err := forecast.WriteCalibration(path, c); err != nil {
		t.Fatal(err)
	}
	back, err := forecast.ReadCalibration(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Points) != 2 || back.Points[1] != c.Points[1] {
		t.Fatalf("read back %+v, wrote %+v", back.Points, c.Points)
	}
}
