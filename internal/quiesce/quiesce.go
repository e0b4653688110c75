package quiesce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// DefaultDrainTimeout bounds WaitDrained (the CLI's --drain-timeout default).
const DefaultDrainTimeout = 5 * time.Minute

// Errors of Run.
var (
	ErrInProgress   = errors.New("a quiesce is already recorded in pgflow_upgrade.quiesce")
	ErrNothing      = errors.New("no quiesce is recorded in pgflow_upgrade.quiesce: nothing to resume or undo")
	ErrDrainTimeout = errors.New("the workers did not drain within --drain-timeout")
	ErrCronAPI      = errors.New("the pgflow cron jobs cannot be paused")
)

// Points at which Hooks.At runs (after the named phase is committed).
const (
	PointPaused     = "paused"
	PointDeprecated = "deprecated"
	PointDrained    = "drained"
	PointApplied    = "applied"
)

// Options of Run.
type Options struct {
	// Mode is recorded for ReadInProgress's resume command (ModeApply, ModeOnline).
	Mode string
	// Resume continues the recorded quiesce from its phase instead of
	// starting one.
	Resume bool
	// DrainTimeout bounds the wait for started tasks (default DefaultDrainTimeout).
	DrainTimeout time.Duration
	// Poll is the interval of the drain's polls (default 250 ms).
	Poll time.Duration
	// LiveWorker: heartbeat age under which a worker is alive (default DefaultLiveWorker).
	LiveWorker time.Duration
	// Progress, if set, is told about each step and each drain poll.
	Progress func(Event)
	// Hooks are for tests.
	Hooks Hooks
}

// Hooks let tests act between the steps.
type Hooks struct {
	// At runs after each point is committed; an error aborts Run.
	At func(ctx context.Context, point string) error
	// Crash: when At fails, return without restoring, as a killed process
	// would (to test --resume-quiesce and --undo-quiesce).
	Crash bool
}

func (o Options) withDefaults() Options {
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.Poll <= 0 {
		o.Poll = 250 * time.Millisecond
	}
	if o.LiveWorker <= 0 {
		o.LiveWorker = DefaultLiveWorker
	}
	if o.Mode == "" {
		o.Mode = ModeApply
	}
	return o
}

// Event is a progress notification.
type Event struct {
	Step        string
	Detail      string
	TasksLeft   int64
	WorkersLeft int64
}

// Report says what the quiesce did.
type Report struct {
	ResumedFrom       Phase     `json:"resumed_from,omitempty"`
	Inventory         Inventory `json:"inventory"`
	Recorded          []Item    `json:"recorded"`
	WorkersDeprecated int       `json:"workers_deprecated"`
	DrainMS           int64     `json:"drain_ms"`
	Applied           bool      `json:"applied"`
	Restored          bool      `json:"restored"`
	// Missing: recorded items gone by the restore (nothing to restore).
	Missing []string `json:"missing,omitempty"`
	// Next: what to run when the quiesce is still recorded (restore failed
	// or a simulated crash).
	Next string `json:"next,omitempty"`
	// LeftStarted: the tasks still started when the upgrade committed,
	// whose workers are gone, and what becomes of them (leftstarted.go).
	LeftStarted *LeftStarted `json:"left_started,omitempty"`
}

// ApplyFunc runs the upgrade. It must call Mark in its transaction before
// committing (the caller chains it into its commit).
type ApplyFunc func(ctx context.Context) error

// Run pauses, deprecates, drains, calls apply, and restores. Any failure or
// interruption after the pause restores what was recorded; the error says
// what failed (and, when the restore failed too, which command finishes it).
func Run(ctx context.Context, conn *pgx.Conn, opts Options, apply ApplyFunc) (*Report, error) {
	opts = opts.withDefaults()
	r := &Report{}
	st, err := Load(ctx, conn)
	if err != nil {
		return r, err
	}
	var phase Phase
	switch {
	case opts.Resume && st == nil:
		return r, ErrNothing
	case opts.Resume:
		phase, r.ResumedFrom = st.Phase, st.Phase
		r.Recorded, r.WorkersDeprecated = st.Items, st.WorkersDeprecated
	case st != nil:
		return r, fmt.Errorf("%w (phase %s, since %s): finish it with `%s` or undo it with `pgflow-upgrade apply --undo-quiesce --yes`",
			ErrInProgress, st.Phase, st.StartedAt.UTC().Format(time.RFC3339), ResumeCommand(st.Mode))
	default:
		if r.Inventory, err = TakeInventory(ctx, conn, opts.LiveWorker); err != nil {
			return r, err
		}
		if why := r.Inventory.Blocked(); why != "" {
			return r, fmt.Errorf("%w: %s", ErrCronAPI, why)
		}
		opts.progress(Event{Step: "pause", Detail: fmt.Sprintf("recording and disabling %d worker function(s), pausing %d cron job(s)", len(r.Inventory.Functions), len(r.Inventory.CronJobs))})
		if r.Recorded, err = Pause(ctx, conn, opts.Mode); err != nil {
			return r, err
		}
		phase = PhasePaused
		if err := opts.hook(ctx, PointPaused); err != nil {
			return r.abort(ctx, conn, opts, err)
		}
	}

	if phase == PhasePaused {
		opts.progress(Event{Step: "deprecate", Detail: "deprecating the live 0.16.0 workers"})
		n, err := Deprecate(ctx, conn, opts.LiveWorker)
		if err != nil {
			return r.abort(ctx, conn, opts, err)
		}
		r.WorkersDeprecated += n
		phase = PhaseDeprecated
		if err := opts.hook(ctx, PointDeprecated); err != nil {
			return r.abort(ctx, conn, opts, err)
		}
	}
	if phase == PhaseDeprecated || phase == PhaseDrained {
		// Drained again on resume: a worker may have started since.
		t := time.Now()
		n, err := WaitDrained(ctx, conn, opts)
		r.DrainMS = time.Since(t).Milliseconds()
		r.WorkersDeprecated += n
		if err != nil {
			return r.abort(ctx, conn, opts, err)
		}
		phase = PhaseDrained
		if err := opts.hook(ctx, PointDrained); err != nil {
			return r.abort(ctx, conn, opts, err)
		}
	}
	if phase != PhaseApplied {
		opts.progress(Event{Step: "apply", Detail: "the upgrade, with every worker function disabled and pgflow's cron jobs paused"})
		if err := apply(ctx); err != nil {
			// The phase is "applied" only if the upgrade committed.
			if s, lerr := Load(context.WithoutCancel(ctx), conn); lerr == nil && s != nil && s.Phase == PhaseApplied {
				r.Applied = true
			}
			return r.abort(ctx, conn, opts, err)
		}
		if s, err := Load(ctx, conn); err == nil && s != nil && s.Phase == PhaseApplied {
			r.Applied = true
		}
		if err := opts.hook(ctx, PointApplied); err != nil {
			return r.abort(ctx, conn, opts, err)
		}
	} else {
		r.Applied = true
	}
	if r.Applied {
		// Read before the restore: no worker has started since.
		if r.LeftStarted, err = ReadLeftStarted(ctx, conn, opts.LiveWorker); err != nil {
			r.LeftStarted = &LeftStarted{Recovery: "the tasks still started could not be read (" + err.Error() + "): `pgflow-upgrade status` and pgflow.step_tasks show them"}
		}
	}
	opts.progress(Event{Step: "restore", Detail: "cron jobs first, then worker functions, to their recorded values"})
	missing, err := Restore(ctx, conn)
	r.Missing = missing
	if err != nil {
		r.Next = ResumeCommand(opts.Mode)
		return r, fmt.Errorf("restoring the recorded values: %w; run `%s` (or `pgflow-upgrade apply --undo-quiesce --yes`)", err, r.Next)
	}
	r.Restored = true
	return r, nil
}

func (o Options) progress(e Event) {
	if o.Progress != nil {
		o.Progress(e)
	}
}

func (o Options) hook(ctx context.Context, point string) error {
	if o.Hooks.At == nil {
		return nil
	}
	if err := o.Hooks.At(ctx, point); err != nil {
		return fmt.Errorf("test hook at %s: %w", point, err)
	}
	return nil
}

// abort restores after a failure, with a context the cancel does not end.
func (r *Report) abort(ctx context.Context, conn *pgx.Conn, opts Options, cause error) (*Report, error) {
	if opts.Hooks.Crash {
		r.Next = ResumeCommand(opts.Mode)
		return r, cause
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	opts.progress(Event{Step: "restore", Detail: "after a failure: cron jobs first, then worker functions, to their recorded values"})
	if conn.IsClosed() {
		// pgx closes a connection whose query was cancelled: restore on a
		// new one shaped as it was.
		fresh, err := session.Reopen(rctx, conn)
		if err != nil {
			r.Next = UndoCommand
			return r, fmt.Errorf("%w; reconnecting to restore the recorded values failed (%v): run `%s`", cause, err, r.Next)
		}
		defer fresh.Close(rctx)
		conn = fresh
	}
	missing, err := Restore(rctx, conn)
	r.Missing = missing
	if err != nil {
		r.Next = UndoCommand
		return r, fmt.Errorf("%w; restoring the recorded values failed too (%v): run `%s`", cause, err, r.Next)
	}
	r.Restored = true
	return r, cause
}

// Undo restores a recorded quiesce whatever its phase (ErrNothing: none).
func Undo(ctx context.Context, conn *pgx.Conn) (*Report, error) {
	r := &Report{}
	st, err := Load(ctx, conn)
	if err != nil {
		return r, err
	}
	if st == nil {
		return r, ErrNothing
	}
	r.ResumedFrom, r.Recorded, r.WorkersDeprecated = st.Phase, st.Items, st.WorkersDeprecated
	r.Applied = st.Phase == PhaseApplied
	if r.Missing, err = Restore(ctx, conn); err != nil {
		return r, err
	}
	r.Restored = true
	return r, nil
}
