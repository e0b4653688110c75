package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// Progress on stderr, on a terminal and off it: a pipeline log of a long
// apply, backfill or replay must show it is alive. Each step is a line when
// it starts and when it ends; while one step runs, a heartbeat line every
// few seconds on a terminal, and at most every 10 s off one.

// progressEvery is the quiet time after which the heartbeat prints.
func (a *App) progressEvery() time.Duration {
	switch {
	case a.heartbeatEvery > 0:
		return a.heartbeatEvery
	case a.Interactive:
		return 3 * time.Second
	}
	return 9 * time.Second // checked every second: a line at least every 10 s
}

// heartbeat prints lines, and "still running" when nothing was printed for
// its interval while an activity (label) is under way.
type heartbeat struct {
	w      io.Writer
	prefix string
	every  time.Duration

	mu    sync.Mutex
	label string    // what runs; "" when idle
	since time.Time // when it started
	last  time.Time // the last line printed
	done  chan struct{}
	once  sync.Once
}

func (a *App) startHeartbeat(prefix, label string) *heartbeat {
	now := time.Now()
	h := &heartbeat{w: a.Stderr, prefix: prefix, every: a.progressEvery(), label: label, since: now, last: now, done: make(chan struct{})}
	go h.loop(min(h.every, time.Second))
	return h
}

func (h *heartbeat) loop(check time.Duration) {
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		select {
		case <-h.done:
			return
		case <-t.C:
			h.mu.Lock()
			if h.label != "" && time.Since(h.last) >= h.every {
				fmt.Fprintf(h.w, "%s... still running (%s): %s\n", h.prefix, time.Since(h.since).Round(time.Second), h.label)
				h.last = time.Now()
			}
			h.mu.Unlock()
		}
	}
}

// printf prints one line; the activity stays.
func (h *heartbeat) printf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.w, format+"\n", args...)
	h.last = time.Now()
}

// say prints one line (none for an empty format) and sets the activity
// ("" for idle).
func (h *heartbeat) say(label, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if format != "" {
		fmt.Fprintf(h.w, format+"\n", args...)
		h.last = time.Now()
	}
	if label != h.label {
		h.label, h.since = label, time.Now()
	}
}

// relabel changes what the heartbeat says without restarting its clock.
func (h *heartbeat) relabel(label string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.label = label
}

func (h *heartbeat) stop() { h.once.Do(func() { close(h.done) }) }

// progress prints apply's steps and statements.
type progress struct{ hb *heartbeat }

func (a *App) newProgress() *progress { return &progress{hb: a.startHeartbeat("    ", "")} }

func (p *progress) event(e upgrade.Event) {
	switch {
	case e.Done:
		p.hb.say("", "  %s done in %s", e.Step, e.Elapsed.Round(time.Millisecond))
	case e.Step == upgrade.StepMigrate && strings.HasPrefix(e.Detail, "["):
		p.hb.say(e.Detail, "    %s", e.Detail) // one statement: the rewrite, an index build
	default:
		p.hb.say(e.Step, "- %s: %s", e.Step, e.Detail)
	}
}

func (p *progress) stop() { p.hb.stop() }

// onlineProgress prints the online path's phases. Backfill progress: every
// event on a terminal; off one, the heartbeat prints the latest.
func (a *App) onlineProgress() (func(online.Event), func()) {
	hb := a.startHeartbeat("    ", "")
	return func(e online.Event) {
		switch {
		case e.Done:
			hb.say("", "  %s done in %s", phaseLabel(e.Phase, e.Detail), e.Elapsed.Round(time.Millisecond))
		case e.Phase == online.PhaseNone:
			// Not a phase of the upgrade (the preflight before it, a lock
			// retry, an autovacuum cancelled): its detail names it.
			hb.say(e.Detail, "- %s", e.Detail)
		case e.Phase == online.PhaseBackfill && e.Total > 0:
			pct := 100 * float64(e.Rows) / float64(e.Total)
			line := fmt.Sprintf("backfill %d / ~%d rows (%.0f%%), %.0f rows/s: %s", e.Rows, e.Total, min(pct, 100), e.Rate, e.Detail)
			if a.Interactive {
				hb.say(line, "    %s", line)
			} else {
				hb.relabel(line)
			}
		default:
			hb.say(string(e.Phase)+": "+e.Detail, "- %s: %s", e.Phase, e.Detail)
		}
	}, hb.stop
}

// phaseLabel names an online step for a person: its phase, or, outside
// the phases ("none"), what the detail says it is (the preflight).
func phaseLabel(p online.Phase, detail string) string {
	name, _, ok := strings.Cut(detail, ":")
	named := ok && name != "" && !strings.Contains(name, " ")
	switch {
	case p == online.PhaseSwitch && named:
		return "switch: " + name // a step of the switch's transaction (apply's own steps)
	case p != online.PhaseNone:
		return string(p)
	case named:
		return name
	}
	return "online"
}
