package forecast

import (
	"fmt"
	"time"
)

// Cost is a duration as a fixed part plus a part per step_tasks row.
type Cost struct {
	FixedMS  float64 `json:"fixed_ms"`
	PerRowUS float64 `json:"per_row_us"` // microseconds per step_tasks row
}

// At is the cost for rows rows.
func (c Cost) At(rows int64) time.Duration {
	ms := c.FixedMS + c.PerRowUS*float64(rows)/1000
	return time.Duration(ms * float64(time.Millisecond))
}

// Model is what the forecast multiplies the row counts by.
type Model struct {
	// Method: how the costs were derived ("fit of fixed + per-row cost over
	// 2 sizes", or "ratio of 1 size" when only one size was measured).
	Method     string `json:"method"`
	LockWindow Cost   `json:"lock_window"`
	// Online is nil when the calibration has no apply --online timing.
	Online *Cost `json:"online,omitempty"`
	// LargestRows: the largest size measured (step_tasks rows).
	LargestRows int64 `json:"largest_rows"`
}

// ModelOf derives the costs from a calibration's measured sizes.
func ModelOf(c Calibration) (Model, error) {
	if err := c.validate(); err != nil {
		return Model{}, fmt.Errorf("calibration: %w", err)
	}
	pts := c.points()
	var lock, online []xy
	for _, p := range pts {
		lock = append(lock, xy{float64(p.StepTasks), p.LockWindowMS})
		if p.OnlineTotalMS > 0 {
			online = append(online, xy{float64(p.StepTasks), p.OnlineTotalMS})
		}
	}
	m := Model{LockWindow: fit(lock)}
	for _, p := range pts {
		m.LargestRows = max(m.LargestRows, p.StepTasks)
	}
	m.Method = method(lock)
	if len(online) > 0 {
		o := fit(online)
		m.Online = &o
	}
	return m, nil
}

type xy struct{ x, y float64 }

func method(pts []xy) string {
	if n := distinctX(pts); n >= 2 {
		return fmt.Sprintf("fit of fixed + per-row cost over %d sizes", n)
	}
	return "ratio of 1 size (no fixed cost: a rehearsal measures one size)"
}

func distinctX(pts []xy) int {
	seen := map[float64]bool{}
	for _, p := range pts {
		seen[p.x] = true
	}
	return len(seen)
}

// fit: least squares of y = fixed + slope·x (in ms and rows). With one
// size, or when noise gives a slope ≤ 0, the ratio through the largest
// size; a negative fixed part is clamped to 0 (the line through the origin).
func fit(pts []xy) Cost {
	largest := pts[0]
	for _, p := range pts {
		if p.x > largest.x {
			largest = p
		}
	}
	ratio := Cost{PerRowUS: largest.y / largest.x * 1000}
	if distinctX(pts) < 2 {
		return ratio
	}
	n := float64(len(pts))
	var sx, sy, sxx, sxy float64
	for _, p := range pts {
		sx, sy, sxx, sxy = sx+p.x, sy+p.y, sxx+p.x*p.x, sxy+p.x*p.y
	}
	slope := (n*sxy - sx*sy) / (n*sxx - sx*sx)
	fixed := (sy - slope*sx) / n
	switch {
	case slope <= 0:
		return ratio
	case fixed < 0:
		return Cost{PerRowUS: sxy / sxx * 1000}
	}
	return Cost{FixedMS: fixed, PerRowUS: slope * 1000}
}
