// Package forecast estimates, before anything runs, how long a transactional `apply` will
// hold its locks and how long `apply --online` will take on a given database. It reads row
// counts from the planner's statistics (never a scan) and multiplies them by per-row costs
// that the tool measured: on a throwaway database built from a sample, or by a rehearsal
// (`fixtures replay --from CAPTURE`), whose timings are written as a Calibration file and
// passed to `audit --calibration FILE`.
package forecast

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// CalibrationFormat is the version of the Calibration file's JSON schema.
const CalibrationFormat = 1

// Calibration is what one measured upgrade taught about this server: the sizes it ran on
// and how long each mode took. A rehearsal writes it; the audit's forecast reads it.
type Calibration struct {
	Format        int       `json:"format"`
	Source        string    `json:"source"` // what was measured: "rehearsal of capture X", "sample of N rows"
	MeasuredAt    time.Time `json:"measured_at"`
	ServerVersion string    `json:"server_version"` // server_version of the database measured on

	// Sizes of the rehearsed database (exact counts: it was a throwaway copy).
	StepTasks  int64 `json:"step_tasks"`
	StepStates int64 `json:"step_states"`
	Steps      int64 `json:"steps"`
	Flows      int64 `json:"flows"`

	// Timings, in milliseconds. Zero means "not measured" (for example a rehearsal run
	// without --online leaves the online figures at zero).
	LockWindowMS        float64 `json:"lock_window_ms"`         // transactional apply: its locks held
	ApplyTotalMS        float64 `json:"apply_total_ms"`         // transactional apply: whole run
	OnlineTotalMS       float64 `json:"online_total_ms"`        // apply --online: whole run
	OnlineLongestWaitMS float64 `json:"online_longest_wait_ms"` // apply --online: the probe's longest wait

	// Points: every size measured, when more than the one above (a sample
	// calibration measures two, so the forecast fits a fixed cost and a
	// per-row cost). Empty: the figures above are the only point.
	Points []Point `json:"points,omitempty"`
}

// Point is one measured size: step_tasks rows and the timings on them.
type Point struct {
	StepTasks     int64   `json:"step_tasks"`
	LockWindowMS  float64 `json:"lock_window_ms"`
	OnlineTotalMS float64 `json:"online_total_ms"` // 0: not measured
}

// WriteCalibration writes c to path as indented JSON (replacing the file atomically).
func WriteCalibration(path string, c Calibration) error {
	c.Format = CalibrationFormat
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the calibration: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the calibration to %s: %w (check the directory exists and is writable)", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing the calibration to %s: %w", path, err)
	}
	return nil
}

// ReadCalibration reads a Calibration file written by WriteCalibration.
func ReadCalibration(path string) (Calibration, error) {
	var c Calibration
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("reading the calibration file %s: %w (pass the file a rehearsal wrote with `fixtures replay --from CAPTURE --calibration-out FILE`)", path, err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("reading the calibration file %s: not a calibration (%v); pass the file a rehearsal wrote", path, err)
	}
	if c.Format != CalibrationFormat {
		return c, fmt.Errorf("reading the calibration file %s: format %d, this tool reads format %d; rerun the rehearsal with this version", path, c.Format, CalibrationFormat)
	}
	if err := c.validate(); err != nil {
		return c, fmt.Errorf("reading the calibration file %s: %w; rerun the rehearsal (or the sample calibration) that wrote it", path, err)
	}
	return c, nil
}

// validate: what a forecast needs from c (at least one size with rows and a
// lock window; no negative timing).
func (c Calibration) validate() error {
	if c.StepTasks <= 0 || c.LockWindowMS <= 0 {
		return fmt.Errorf("it holds no measured lock window or no rows (step_tasks %d, lock_window_ms %g)", c.StepTasks, c.LockWindowMS)
	}
	if c.ApplyTotalMS < 0 || c.OnlineTotalMS < 0 || c.OnlineLongestWaitMS < 0 {
		return fmt.Errorf("it holds a negative timing")
	}
	for i, p := range c.Points {
		if p.StepTasks <= 0 || p.LockWindowMS <= 0 || p.OnlineTotalMS < 0 {
			return fmt.Errorf("point %d: step_tasks %d, lock_window_ms %g, online_total_ms %g: each point needs rows and a positive lock window",
				i, p.StepTasks, p.LockWindowMS, p.OnlineTotalMS)
		}
	}
	return nil
}

// points: c's measured sizes (Points, or the top-level figures as one).
func (c Calibration) points() []Point {
	if len(c.Points) > 0 {
		return c.Points
	}
	return []Point{{StepTasks: c.StepTasks, LockWindowMS: c.LockWindowMS, OnlineTotalMS: c.OnlineTotalMS}}
}
