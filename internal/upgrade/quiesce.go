package upgrade

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
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
func applyQuiesced(ctx context.Context, conn *pgx.Conn, opts Options) (*outcome.Result[*Report], error) {
	q := *opts.Quiesce
	opts.Quiesce = nil
	if !q.Resume {
		// The state first: only the 0.16.0 baseline is quiesced (and, in the
		// online switch, the shape AcceptState vouches for in the
		// transaction). Anything else gets Apply's own answer, with nothing
		// paused: already 0.17.x is a no-op, any other state (or an open
		// record, on a dry run) its refusal before any table lock.
		st, err := versions.DetectSchema(ctx, conn)
		if err != nil {
			res := &outcome.Result[*Report]{Report: &Report{DryRun: opts.DryRun, BackendPID: conn.PgConn().PID()}}
			return res, outcome.Settle(ctx, conn, res, fmt.Errorf("detecting the schema state before --quiesce: %w", err))
		}
		open := st.Version != nil && st.Version.Quiesce != nil
		switch {
		case open && !opts.DryRun:
			// quiesce.Run refuses it, naming the commands that close it.
		case !open && (st.State == versions.SchemaBaseline || (st.State == versions.SchemaPartial && opts.AcceptState != nil)):
		case !open && st.State == versions.SchemaUpgraded && opts.PGMQ != "":
			// The pgmq hop alone (pgflow 0.17): its workers are fenced too.
		case !open && upstreamHopsAhead(st, opts):
			// A plan of upstream's files from 0.17.x or an older release
			// (hops.go): quiesced like the 0.16.0 one, the telemetry job
			// 0.17.1 scheduled paused and restored with pgflow's others.
		default:
			res, err := Apply(ctx, conn, opts)
			if err != nil && !open {
				res.Message += "; --quiesce paused nothing: it quiesces the pgflow 0.16.0 baseline only"
			}
			return res, err
		}
	}
	if opts.DryRun {
		return dryRunQuiesced(ctx, conn, opts, q)
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
	var res *outcome.Result[*Report]
	qr, qerr := quiesce.Run(ctx, conn, q, func(ctx context.Context) error {
		var err error
		res, err = Apply(ctx, conn, opts)
		return err
	})
	if res == nil {
		res = &outcome.Result[*Report]{Report: &Report{BackendPID: conn.PgConn().PID()}}
	}
	res.Report.Quiesce = &QuiesceReport{Report: qr}
	if qerr == nil {
		if qr.Restored {
			res.Message += fmt.Sprintf("; quiesce: %d worker function/cron value(s) recorded and restored, %d 0.16.0 worker(s) deprecated, drained in %d ms",
				len(qr.Recorded), qr.WorkersDeprecated, qr.DrainMS)
		}
		if l := qr.LeftStarted; l != nil && l.Tasks > 0 {
			res.Message += "; " + l.Summary() + ": " + l.Recovery
		}
		return res, nil
	}
	switch {
	case res.Outcome == "" && quiesceRefused(qerr):
		res.Outcome = outcome.Refused // before anything was paused, or the drain gave up
	case res.Outcome == outcome.Applied || res.Outcome == outcome.AlreadyApplied:
		res.Outcome = outcome.Failed // applied, but what followed failed
	}
	res.Message = qerr.Error()
	if qr.Applied {
		res.Message += "; the upgrade to 0.17.0 was committed"
	}
	if qr.Restored {
		res.Message += "; the recorded worker functions and cron jobs were restored"
	}
	return res, outcome.Settle(ctx, conn, res, qerr)
}

// quiesceRefused says whether quiesce.Run's error is one of its refusals.
func quiesceRefused(err error) bool {
	return errors.Is(err, quiesce.ErrInProgress) || errors.Is(err, quiesce.ErrNothing) ||
		errors.Is(err, quiesce.ErrDrainTimeout) || errors.Is(err, quiesce.ErrCronAPI)
}

// dryRunQuiesced changes nothing: the inventory says what --quiesce would
// change, and the transaction runs as any dry run does.
func dryRunQuiesced(ctx context.Context, conn *pgx.Conn, opts Options, q quiesce.Options) (*outcome.Result[*Report], error) {
	inv, err := quiesce.TakeInventory(ctx, conn, q.LiveWorker)
	if err != nil {
		res := &outcome.Result[*Report]{Report: &Report{DryRun: true}}
		return res, outcome.Settle(ctx, conn, res, err)
	}
	live := q.LiveWorker
	if live <= 0 {
		live = quiesce.DefaultLiveWorker
	}
	left, err := quiesce.ReadLeftStarted(ctx, conn, live)
	if err != nil {
		res := &outcome.Result[*Report]{Report: &Report{DryRun: true}}
		return res, outcome.Settle(ctx, conn, res, err)
	}
	res, aerr := Apply(ctx, conn, opts)
	plan := inv.Changes()
	if left.Tasks > 0 {
		plan = append(plan, fmt.Sprintf("leave %d task(s) started by %d worker(s) that are not live (the oldest since %s): %s",
			left.Tasks, len(left.Workers), left.Workers[0].OldestStarted.UTC().Format(time.RFC3339), left.Recovery))
	}
	if why := inv.Blocked(); why != "" {
		plan = append(plan, "REFUSED: "+why)
	}
	res.Report.Quiesce = &QuiesceReport{Report: &quiesce.Report{Inventory: inv, LeftStarted: left}, Plan: plan}
	if aerr == nil {
		res.Message += "; --quiesce would pause and restore what its plan lists (nothing was paused, so nothing is restored)"
	}
	return res, aerr
}

// UndoReport is what UndoQuiesce did (Result.Report).
type UndoReport struct {
	Quiesce *quiesce.Report `json:"quiesce"`
}

// UndoQuiesce restores every value a recorded quiesce holds, whatever its
// phase, without upgrading (apply --undo-quiesce): outcome.Undone, or
// outcome.NothingToDo when no quiesce is recorded.
func UndoQuiesce(ctx context.Context, conn *pgx.Conn) (*outcome.Result[*UndoReport], error) {
	qr, err := quiesce.Undo(ctx, conn)
	res := &outcome.Result[*UndoReport]{Report: &UndoReport{Quiesce: qr}}
	switch {
	case errors.Is(err, quiesce.ErrNothing):
		res.Outcome, res.Message = outcome.NothingToDo, "nothing to undo: no quiesce is recorded"
		return res, nil
	case err == nil:
		res.Outcome = outcome.Undone
		res.Message = fmt.Sprintf("restored %d recorded value(s) (found phase %s)", len(qr.Recorded), qr.ResumedFrom)
		if qr.Applied {
			res.Message += "; the upgrade to 0.17.0 had been committed and stays"
		}
		return res, nil
	}
	return res, outcome.Settle(ctx, conn, res, err)
}

// upstreamHopsAhead: the database is at a release below the newest (other
// than 0.16.0) and apply was given a folder that may hold upstream's files,
// so its plan may run them.
func upstreamHopsAhead(st versions.SchemaInfo, opts Options) bool {
	if opts.PgflowMigrations == "" && opts.SupabaseDir == "" {
		return false
	}
	if (st.State != versions.SchemaUpgraded && st.State != versions.SchemaOlder) || st.Version == nil {
		return false
	}
	r := st.Version.Release
	return r != nil && !r.AtNewest() && r.Refusal() == ""
}
