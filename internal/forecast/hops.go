package forecast

import (
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// HopForecast is the forecast of one hop of the plan: what it locks, how
// apply runs each locking statement and how many rows (estimated, from the
// statistics) its time grows with.
type HopForecast struct {
	Hop  string `json:"hop"`  // "0.14.1 -> 0.15.0"
	File string `json:"file"` // upstream's file whose place the hop takes
	Own  bool   `json:"own"`  // this tool's migration, not upstream's file
	// Locks: the statements that lock a pgflow table (none: functions only).
	Locks []HopLock `json:"locks"`
	// LockWindowMS: the own hop's expected lock window (the calibrated
	// estimate), when there is one.
	LockWindowMS *int64 `json:"lock_window_ms,omitempty"`
	// Summary says it in one line.
	Summary string `json:"summary"`
}

// HopLock is one locking statement of a hop.
type HopLock struct {
	Statement string          `json:"statement"`
	Table     string          `json:"table"`
	Lock      string          `json:"lock"`   // as upstream's statement takes it
	Blocks    string          `json:"blocks"` // what that lock blocks
	Run       versions.HowRun `json:"run"`    // how apply runs it
	// GrowsWith and Rows: the table its time grows with and that table's
	// estimated rows (absent: catalog only).
	GrowsWith string `json:"grows_with,omitempty"`
	Rows      *int64 `json:"rows,omitempty"`
	// ActiveOnly: apply reaches the rows through the partial indexes on
	// queued and started tasks, so it grows with those, not with Rows.
	ActiveOnly bool `json:"active_only,omitempty"`
}

// PerHop forecasts every hop from a database holding upstream's first
// from files to upstream's newest release. own is the own hop's estimate
// (nil without a basis).
func PerHop(rows Stats, from int, own *Forecast) []HopForecast {
	files := versions.UpstreamFiles()
	var out []HopForecast
	for n := from + 1; n <= len(files); n++ {
		h := HopForecast{Hop: versions.StateName(n-1) + " -> " + versions.StateName(n), File: files[n-1].Name, Own: n == versions.OwnHopFile, Locks: []HopLock{}}
		for _, l := range versions.HopLocks(n) {
			hl := HopLock{Statement: l.Statement, Table: l.Table, Lock: l.Lock, Blocks: l.Blocks, Run: l.Run, GrowsWith: l.GrowsWith, ActiveOnly: l.Indexed}
			if r, ok := rows.of(l.GrowsWith); ok {
				hl.Rows = &r
			}
			h.Locks = append(h.Locks, hl)
		}
		if h.Own && own != nil && own.Available {
			ms := own.LockWindowMS
			h.LockWindowMS = &ms
		}
		h.Summary = h.summary()
		out = append(out, h)
	}
	return out
}

// of is the estimated rows of table (schema-qualified), when it is one the
// statistics read.
func (s Stats) of(table string) (int64, bool) {
	name, ok := strings.CutPrefix(table, "pgflow.")
	if p := s.count(name); ok && p != nil {
		return *p, true
	}
	return 0, false
}

func (h HopForecast) summary() string {
	if h.Own {
		if h.LockWindowMS != nil {
			return fmt.Sprintf("this tool's migration: holds pgflow's tables about %s in the transaction (the estimate above); apply --online keeps each lock short", msDuration(*h.LockWindowMS))
		}
		return "this tool's migration: its lock window grows with pgflow.step_tasks (the estimate above needs a basis); apply --online keeps each lock short"
	}
	if len(h.Locks) == 0 {
		return "functions only: no table lock the application meets"
	}
	var parts []string
	for _, l := range h.Locks {
		parts = append(parts, l.text())
	}
	return strings.Join(parts, "; ")
}

func (l HopLock) text() string {
	size := "catalog only"
	if l.Rows != nil {
		size = fmt.Sprintf("about %d rows of %s", *l.Rows, l.GrowsWith)
		if l.ActiveOnly {
			size = fmt.Sprintf("the queued and started tasks of %s (of about %d rows)", l.GrowsWith, *l.Rows)
		}
	}
	if l.Run == versions.Beforehand {
		return fmt.Sprintf("%s: built beforehand over %s, reads and writes go on (upstream: %s on %s, %s blocked)", l.Statement, size, l.Lock, l.Table, l.Blocks)
	}
	return fmt.Sprintf("%s: %s on %s in the transaction, %s", l.Statement, l.Lock, l.Table, size)
}

func msDuration(ms int64) string { return round(time.Duration(ms) * time.Millisecond).String() }
