package forecast

import (
	"fmt"
	"time"
)

// DefaultOnlineThreshold: above this expected lock window the forecast
// recommends `apply --online`.
const DefaultOnlineThreshold = 5 * time.Second

// Basis kinds.
const (
	BasisFile   = "calibration_file" // --calibration FILE (a rehearsal's, or a saved sample)
	BasisSample = "sample"           // measured now on a throwaway database
)

// Basis says what an estimate rests on.
type Basis struct {
	Kind       string    `json:"kind"`   // BasisFile or BasisSample
	Source     string    `json:"source"` // the file, or the sample's sizes and where it ran
	Server     string    `json:"server"` // server_version measured on
	MeasuredAt time.Time `json:"measured_at"`
	Model
}

// BasisOf is the basis of an estimate from calibration c (kind BasisFile
// or BasisSample; source describes the file or the sample).
func BasisOf(kind, source string, c Calibration) (Basis, error) {
	m, err := ModelOf(c)
	if err != nil {
		return Basis{}, err
	}
	return Basis{Kind: kind, Source: source, Server: c.ServerVersion, MeasuredAt: c.MeasuredAt.UTC(), Model: m}, nil
}

// Forecast is the audit's estimate of what an upgrade will cost on the
// audited database (docs/audit.md, "forecast").
type Forecast struct {
	// Available: the estimates below are set. When false, Reason says why
	// and what to do; Rows may still be set.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	Rows      *Stats `json:"rows,omitempty"`
	Basis     *Basis `json:"basis,omitempty"`
	// LockWindowMS: expected lock window of a transactional apply.
	LockWindowMS int64 `json:"lock_window_ms,omitempty"`
	// OnlineTotalMS: expected duration of apply --online; nil when the
	// basis has no online timing.
	OnlineTotalMS *int64 `json:"online_total_ms,omitempty"`
	// Extrapolation: the audited rows over the largest size measured.
	// Above ExtrapolationCaveat, Caveat says what the estimate leaves out.
	Extrapolation   float64 `json:"extrapolation,omitempty"`
	Caveat          string  `json:"caveat,omitempty"`
	ThresholdMS     int64   `json:"online_threshold_ms"`
	RecommendOnline bool    `json:"recommend_online"`
	Recommendation  string  `json:"recommendation,omitempty"`
	// Hops: the plan to upstream's newest release, hop by hop (PerHop);
	// absent when the database is not on the way there.
	Hops []HopForecast `json:"hops,omitempty"`
}

// ExtrapolationCaveat: past this many times the largest size measured, the
// forecast warns that it is likely low. Measured (BENCHMARKS.md, "audit
// forecast"): from a 200,000-row sample, 1M rows came within 0.9x, while at
// 5M the lock window was about 3x the linear estimate (sorts that spill, a
// table that no longer fits in memory).
const ExtrapolationCaveat = 10

// Unavailable is a forecast without estimates: why, and what to do.
func Unavailable(rows *Stats, threshold time.Duration, reason string) *Forecast {
	return &Forecast{Rows: rows, ThresholdMS: threshold.Milliseconds(), Reason: reason}
}

// Estimate multiplies the row counts by the basis's costs.
func Estimate(rows Stats, b Basis, threshold time.Duration) *Forecast {
	f := &Forecast{Available: true, Rows: &rows, Basis: &b, ThresholdMS: threshold.Milliseconds()}
	lock := b.LockWindow.At(rows.StepTasks)
	f.LockWindowMS = lock.Milliseconds()
	var online time.Duration
	if b.Online != nil {
		online = b.Online.At(rows.StepTasks)
		ms := online.Milliseconds()
		f.OnlineTotalMS = &ms
	}
	if b.LargestRows > 0 {
		f.Extrapolation = float64(rows.StepTasks) / float64(b.LargestRows)
	}
	if f.Extrapolation > ExtrapolationCaveat {
		f.Caveat = fmt.Sprintf("%.0fx the largest size measured (%d rows): costs that grow faster than the rows (sorts that spill to disk, a table that outgrows the cache) are not in the estimate, which is likely low; "+
			"rehearse on a capture of this database (--calibration) or measure larger sizes (--calibrate-rows)", f.Extrapolation, b.LargestRows)
	}
	f.RecommendOnline = lock > threshold
	switch {
	case f.RecommendOnline && b.Online != nil:
		f.Recommendation = fmt.Sprintf("use apply --online: a transactional apply would lock pgflow's tables for about %s (above %s); apply --online should take about %s, its lock windows short",
			round(lock), threshold, round(online))
	case f.RecommendOnline:
		f.Recommendation = fmt.Sprintf("use apply --online: a transactional apply would lock pgflow's tables for about %s (above %s)", round(lock), threshold)
	default:
		f.Recommendation = fmt.Sprintf("a transactional apply: it should lock pgflow's tables for about %s (under %s)", round(lock), threshold)
	}
	return f
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
