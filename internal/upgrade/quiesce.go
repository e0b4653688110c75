package upgrade

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
)

// QuiesceReport is what apply --quiesce did around the transaction.
type QuiesceReport struct {
	*quiesce.Report
	// Plan: with DryRun, what --quiesce would change (nothing was).
	Plan []string `json:"plan,omitempty"`
}

// applyQuiesced is Apply inside quiesce.Run: the functions and cron jobs
// paused and recorded, the workers deprecated and drained, then this
// transaction (which marks the quiesce applied as it commits), then the
// recorded values restored. The online path gets the same around its
// switch, since its switch is an Apply with the same Options.Quiesce.
func applyQuiesced(ctx context.Context, conn *pgx.Conn, opts Options) (*Report, error) {
	q := *opts.Quiesce
	opts.Quiesce = nil
	if !q.Resume {
		// The state first: only the 0.16.0 baseline is quiesced (and, in the
		// online switch, the shape AcceptState vouches for in the
		// transaction). Anything else gets Apply's own answer, with nothing
		// paused: already 0.17.x is a no-op, any other state (or an open
		// record, on a dry run) its refusal before any table lock.
		st, err := DetectState(ctx, conn)
		if err != nil {
			err = fmt.Errorf("detecting the schema state before --quiesce: %w", err)
			return &Report{DryRun: opts.DryRun, Outcome: OutcomeFailed, Message: err.Error(), BackendPID: conn.PgConn().PID()}, &Error{Outcome: OutcomeFailed, Err: err}
		}
		open := st.Version != nil && st.Version.Quiesce != nil
		switch {
		case open && !opts.DryRun:
			// quiesce.Run refuses it, naming the commands that close it.
		case !open && (st.State == audit.StateBaseline || (st.State == audit.StatePartial && opts.AcceptState != nil)):
		default:
			rep, err := Apply(ctx, conn, opts)
			if err != nil && !open {
				rep.Message += "; --quiesce paused nothing: it quiesces the pgflow 0.16.0 baseline only"
			}
			return rep, err
		}
	}
	if opts.DryRun {
		// Changes nothing: the inventory says what would change, and the
		// transaction runs as any dry run does.
		inv, err := quiesce.TakeInventory(ctx, conn, q.LiveWorker)
		if err != nil {
			return &Report{DryRun: true, Outcome: OutcomeFailed, Message: err.Error()}, &Error{Outcome: OutcomeFailed, Err: err}
		}
		rep, aerr := Apply(ctx, conn, opts)
		plan := inv.Changes()
		if why := inv.Blocked(); why != "" {
			plan = append(plan, "REFUSED: "+why)
		}
		rep.Quiesce = &QuiesceReport{Report: &quiesce.Report{Inventory: inv}, Plan: plan}
		if aerr == nil {
			rep.Message += "; --quiesce would pause and restore what its plan lists (nothing was paused, so nothing is restored)"
		}
		return rep, aerr
	}
	opts.quiesced = true
	before := opts.BeforeCommit
	opts.BeforeCommit = func(ctx context.Context, tx pgx.Tx) error {
		if before != nil {
			if err := before(ctx, tx); err != nil {
				return err
			}
		}
		return quiesce.Mark(ctx, tx)
	}
	var rep *Report
	qr, qerr := quiesce.Run(ctx, conn, q, func(ctx context.Context) error {
		var err error
		rep, err = Apply(ctx, conn, opts)
		return err
	})
	if rep == nil {
		rep = &Report{BackendPID: conn.PgConn().PID()}
	}
	rep.Quiesce = &QuiesceReport{Report: qr}
	if qerr == nil {
		if qr.Restored {
			rep.Message += fmt.Sprintf("; quiesce: %d worker function/cron value(s) recorded and restored, %d 0.16.0 worker(s) deprecated, drained in %d ms",
				len(qr.Recorded), qr.WorkersDeprecated, qr.DrainMS)
		}
		return rep, nil
	}
	o := OutcomeOf(qerr)
	var ae *Error
	switch {
	case ctx.Err() != nil:
		o = OutcomeInterrupted
	case errors.As(qerr, &ae):
	case errors.Is(qerr, quiesce.ErrInProgress), errors.Is(qerr, quiesce.ErrNothing),
		errors.Is(qerr, quiesce.ErrDrainTimeout), errors.Is(qerr, quiesce.ErrCronAPI):
		o = OutcomeRefused
	}
	switch {
	case o == OutcomeInterrupted, rep.Outcome == "":
		rep.Outcome = o
	case rep.Outcome == OutcomeApplied || rep.Outcome == OutcomeAlreadyApplied:
		rep.Outcome = OutcomeFailed // applied, but what followed failed
	}
	rep.Message = qerr.Error()
	if qr.Applied {
		rep.Message += "; the upgrade to 0.17.0 was committed"
	}
	if qr.Restored {
		rep.Message += "; the recorded worker functions and cron jobs were restored"
	}
	return rep, &Error{Outcome: rep.Outcome, Err: qerr}
}
