package forecast_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// TestPerHop: from 0.14.1 every hop to the newest is listed with its
// locks and the rows they grow with; the own hop carries the calibrated
// estimate; a release past the own hop lists only what is left.
func TestPerHop(t *testing.T) {
	rows := forecast.Stats{StepTasks: 1_000_000, Runs: 500_000, Workers: 7, WorkerFunctions: 3}
	own := &forecast.Forecast{Available: true, LockWindowMS: 8123}
	hops := forecast.PerHop(rows, 20, own)
	if len(hops) != 7 {
		t.Fatalf("from 0.14.1: %d hops, want 7 (files 21-27)", len(hops))
	}
	if h := hops[0]; h.Hop != "0.14.1 -> 0.15.0" || len(h.Locks) != 1 || h.Locks[0].Rows == nil || *h.Locks[0].Rows != 3 ||
		h.Locks[0].Run != versions.InTransaction || !strings.Contains(h.Summary, "about 3 rows of pgflow.worker_functions") {
		t.Errorf("hop 21: %+v", h)
	}
	check := hops[1].Locks[0]
	if check.Run != versions.Beforehand || check.Rows == nil || *check.Rows != 1_000_000 || !strings.Contains(hops[1].Summary, "reads and writes go on") {
		t.Errorf("hop 22's CHECK: %+v (%s)", check, hops[1].Summary)
	}
	if upd := hops[1].Locks[1]; !upd.ActiveOnly || !strings.Contains(hops[1].Summary, "the queued and started tasks of pgflow.step_tasks") {
		t.Errorf("hop 22's repairs: %+v (%s)", upd, hops[1].Summary)
	}
	if h := hops[2]; len(h.Locks) != 0 || !strings.Contains(h.Summary, "functions only") {
		t.Errorf("hop 23: %+v", h)
	}
	if h := hops[3]; !h.Own || h.LockWindowMS == nil || *h.LockWindowMS != 8123 || !strings.Contains(h.Summary, "8.1s") {
		t.Errorf("own hop: %+v", h)
	}
	if h := hops[5]; h.Locks[0].Table != "pgflow.runs" || *h.Locks[0].Rows != 500_000 || h.Locks[0].Run != versions.Beforehand {
		t.Errorf("hop 26's index on runs: %+v", h.Locks[0])
	}
	if h := forecast.PerHop(rows, 20, nil)[3]; h.LockWindowMS != nil || !strings.Contains(h.Summary, "needs a basis") {
		t.Errorf("own hop without a basis: %+v", h)
	}
	later := forecast.PerHop(rows, 24, nil)
	if len(later) != 3 || later[0].Hop != "0.17.0 -> upstream's first 25 files (after 0.17.0)" || later[2].Hop != "0.17.1 without the endpoint fix -> "+versions.Newest {
		t.Errorf("from 0.17.0: %+v", later)
	}
	if n := len(forecast.PerHop(rows, 27, nil)); n != 0 {
		t.Errorf("at the newest: %d hops", n)
	}
}
