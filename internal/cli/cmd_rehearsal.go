package cli

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// The figures of a rehearsal (`fixtures replay --from CAPTURE`): reported
// in the table, the JSON and the JUnit file, and written as a calibration
// for the audit's forecast.

// rehearsalReport is the "rehearsal" object of replay's JSON.
type rehearsalReport struct {
	// Plan is apply's plan the rehearsal ran, made from the capture's
	// release (its timings are the whole plan's).
	Plan                  *upgrade.Plan `json:"plan,omitempty"`
	StepTasks             int64         `json:"step_tasks"`
	LockWindowMS          float64       `json:"lock_window_ms"`
	MaxLockWindowMS       float64       `json:"max_lock_window_ms,omitempty"`
	ApplyTotalMS          float64       `json:"apply_total_ms"`
	OnlineTotalMS         float64       `json:"online_total_ms"`
	OnlineLongestWaitMS   float64       `json:"online_longest_wait_ms"`
	MaxWaitMS             float64       `json:"max_wait_ms,omitempty"`
	OnlineLongestLockMS   float64       `json:"online_longest_lock_window_ms"`
	LockWindowOverBudget  bool          `json:"lock_window_over_budget"`
	LongestWaitOverBudget bool          `json:"longest_wait_over_budget"`
}

func msOf(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func newRehearsalReport(r *rehearsal.Rehearsal) *rehearsalReport {
	m := r.Measured()
	return &rehearsalReport{
		Plan:                  r.Plan,
		StepTasks:             m.StepTasks,
		LockWindowMS:          msOf(m.LockWindow),
		MaxLockWindowMS:       msOf(r.MaxLockWindow),
		ApplyTotalMS:          msOf(m.ApplyTotal),
		OnlineTotalMS:         msOf(m.OnlineTotal),
		OnlineLongestWaitMS:   msOf(m.OnlineLongestWait),
		MaxWaitMS:             msOf(r.MaxWait),
		OnlineLongestLockMS:   msOf(m.OnlineLockWindow),
		LockWindowOverBudget:  r.MaxLockWindow > 0 && m.LockWindow > r.MaxLockWindow,
		LongestWaitOverBudget: r.MaxWait > 0 && m.OnlineLongestWait > r.MaxWait,
	}
}

func (r *rehearsalReport) rows() [][]string {
	budget := func(ms float64, over bool) string {
		switch {
		case ms == 0:
			return "none"
		case over:
			return fmtMS(ms) + " EXCEEDED"
		}
		return fmtMS(ms)
	}
	value := func(ms float64, measured bool) string {
		if !measured {
			return "not measured"
		}
		return fmtMS(ms)
	}
	tx, on := r.ApplyTotalMS > 0, r.OnlineTotalMS > 0
	return [][]string{
		{"step_tasks rows", fmt.Sprint(r.StepTasks), ""},
		{"transactional apply: lock window", value(r.LockWindowMS, tx), budget(r.MaxLockWindowMS, r.LockWindowOverBudget)},
		{"transactional apply: total", value(r.ApplyTotalMS, tx), ""},
		{"apply --online: probe's longest wait", value(r.OnlineLongestWaitMS, on), budget(r.MaxWaitMS, r.LongestWaitOverBudget)},
		{"apply --online: longest lock window", value(r.OnlineLongestLockMS, on), ""},
		{"apply --online: total", value(r.OnlineTotalMS, on), ""},
	}
}

// fmtMS prints milliseconds: whole ones, or the fraction of a small budget.
func fmtMS(ms float64) string {
	if ms < 1 {
		return fmt.Sprintf("%.3g ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// junitNames names every case after the capture too: a pipeline that
// rehearses several captures tells their cases apart.
func junitNames(results []scenario.Result, from string) []scenario.Result {
	if from == "" {
		return results
	}
	out := make([]scenario.Result, len(results))
	for i, r := range results {
		r.Name = fmt.Sprintf("%s [%s]", r.Name, filepath.Base(from))
		out[i] = r
	}
	return out
}

// writeCalibration writes what the rehearsal measured for the forecast.
// Its source says what was measured: the capture, and the plan when it is
// more than this tool's own hop (its timings are then the whole plan's).
func writeCalibration(path, from string, r *rehearsal.Rehearsal) error {
	m := r.Measured()
	if m.LockWindow <= 0 && m.StepTasks == 0 {
		return fmt.Errorf("--calibration-out %s: the rehearsal measured nothing to calibrate with (run capture-upgrade-survives, and capture-online-survives for the online figures)", path)
	}
	source := "rehearsal of capture " + filepath.Base(from)
	if !r.OwnHopOnly() {
		source += "; the timings are the whole plan's, not this tool's own hop alone: " + r.PlanSummary()
	}
	return forecast.WriteCalibration(path, forecast.Calibration{
		Source:              source,
		MeasuredAt:          time.Now().UTC().Truncate(time.Second),
		ServerVersion:       m.ServerVersion,
		StepTasks:           m.StepTasks,
		StepStates:          m.StepStates,
		Steps:               m.Steps,
		Flows:               m.Flows,
		LockWindowMS:        msOf(m.LockWindow),
		ApplyTotalMS:        msOf(m.ApplyTotal),
		OnlineTotalMS:       msOf(m.OnlineTotal),
		OnlineLongestWaitMS: msOf(m.OnlineLongestWait),
	})
}
