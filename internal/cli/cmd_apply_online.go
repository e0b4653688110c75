package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// onlineFlags are apply's flags for the online path (docs/online.md).
func onlineFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "online", Usage: "upgrade without blocking the application: expand, batched backfill, contract, then a short switch (docs/online.md); run again to continue after an interruption"},
		&ucli.BoolFlag{Name: "rollback-online", Usage: "undo an unfinished online upgrade (before its switch): back to the exact 0.16.0 baseline"},
		&ucli.IntFlag{Name: "batch-size", Value: online.DefaultBatchSize, Usage: "--online: the most rows one backfill batch updates (the size adapts below it to ~100 ms batches)"},
		&ucli.Float64Flag{Name: "max-rate", Usage: "--online: backfill rows per second at most (0: no limit)"},
		&ucli.DurationFlag{Name: "pause", Usage: "--online: pause between backfill batches"},
		&ucli.DurationFlag{Name: "max-replica-lag", Value: online.DefaultMaxReplicaLag, Usage: "--online: wait while a standby's replay_lag is above this (negative: do not look)"},
	}
}

// applyOnlineAction is apply with --online or --rollback-online. The
// table-lock flags keep their meaning; their defaults are the online ones
// unless given.
func (a *App) applyOnlineAction(c *ucli.Context) error {
	if c.Bool("online") && c.Bool("rollback-online") {
		return usageErrorf("--online and --rollback-online exclude each other")
	}
	if c.Bool("dry-run") {
		return usageErrorf("--dry-run is not available with --online/--rollback-online (the online phases commit as they go); use apply --dry-run on a copy to see the migration")
	}
	if c.Int("batch-size") <= 0 || c.Float64("max-rate") < 0 || c.Duration("pause") < 0 {
		return usageErrorf("--batch-size must be positive, --max-rate and --pause not negative")
	}
	if !c.Bool("yes") && !a.Interactive {
		return usageErrorf("apply changes the database: pass --yes (pipelines), or run it on a terminal")
	}
	telemetryOff, err := telemetryFlag(c)
	if err != nil {
		return err
	}
	if err := toFlag(c); err != nil {
		return err
	}
	t, err := a.resolveTarget(c, "apply", false)
	if err != nil {
		return err
	}
	ctx := c.Context
	conn, err := a.connect(ctx, t)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	where := session.Describe(t.config)
	if err := applyPrecheck(ctx, conn); err != nil { // envcheck.go: a standby, a read-only default
		remains, _ := a.onlineRemains(ctx, t, true)
		return withCode(ExitEnvironment, fmt.Errorf("apply on %s: %w%s", where, err, remains))
	}
	lockTimeout, lockRetries := online.DefaultLockTimeout, online.DefaultLockRetries
	if c.IsSet("lock-timeout") {
		lockTimeout = c.Duration("lock-timeout")
	}
	if c.IsSet("lock-retries") {
		lockRetries = c.Int("lock-retries")
	}
	prog, stopProgress := a.onlineProgress() // progress.go
	defer stopProgress()

	if c.Bool("rollback-online") {
		res, err := online.Rollback(ctx, conn, online.RollbackOptions{LockTimeout: lockTimeout, LockRetries: lockRetries, Wait: c.Duration("wait"), Progress: prog})
		return finishRun(a, c, "apply --rollback-online", where, res, err, func(w io.Writer) error {
			_, werr := fmt.Fprintf(w, "pgflow-upgrade apply --rollback-online on %s: %s (found phase %s)\n%s\n", where, res.Outcome, res.Report.PhaseFound, a.redact(res.Message))
			return werr
		})
	}

	opts := online.Options{
		BatchSize: c.Int("batch-size"), MaxRate: c.Float64("max-rate"), Pause: c.Duration("pause"),
		MaxReplicaLag: c.Duration("max-replica-lag"), LockTimeout: lockTimeout, LockRetries: lockRetries,
		Wait: c.Duration("wait"), Progress: prog,
		Preflight: audit.Options{Sample: c.Int("sample"), CheckTimeout: c.Duration("check-timeout")},
		// The quiesce goes around the switch only; the plan's hops after
		// this tool's own run in the switch transaction.
		Switch: upgrade.Options{Quiesce: a.quiesceOptions(c, quiesce.ModeOnline),
			To: c.String("to"), PgflowMigrations: c.String("pgflow-migrations"), TelemetryOff: telemetryOff},
	}
	res, err := online.Upgrade(ctx, conn, opts)
	if err != nil {
		err = a.explainOnlineStop(ctx, t, res, err)
	}
	return finishRun(a, c, "apply --online", where, res, err, func(w io.Writer) error { return writeOnlineTable(w, where, res) })
}

// explainOnlineStop rewrites the message of an online upgrade that stopped:
// the environment's cause when one is found (then the error is that
// envError), and what the run left in the database and what to run next.
func (a *App) explainOnlineStop(ctx context.Context, t *target, res *outcome.Result[*online.Report], err error) error {
	var lost *session.LostError
	blocked := errors.As(err, &lost)
	if env := a.diagnose(ctx, t, err); env != nil {
		// A rerun fails the same way (no "run again to continue"),
		// unless the diagnosis says it may pass.
		env = env.forOnline()
		err, res.Message, blocked = env, env.Error(), !env.mayPass()
	}
	remains, phase := a.onlineRemains(ctx, t, blocked)
	msg := withoutRerunAdvice(res.Message)
	if phase {
		// The switch's own words are about its transaction only.
		msg = strings.ReplaceAll(msg, "rolled back, nothing was changed", "the switch was rolled back")
		msg = strings.ReplaceAll(msg, "nothing was changed", "the switch changed nothing")
	}
	res.Message = msg + remains
	return err
}

// restarting says whether a failed connection is to a server that is
// restarting: recovering (57P03), or resetting its sessions (the socket
// refused, reset, or closed before the startup answered: unexpected EOF).
// The connection's error is text by then (connect redacts it).
func restarting(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "(SQLSTATE 57P03)") || strings.Contains(msg, "connection reset by peer") || strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "unexpected EOF")
}

// recoveryWait is how long onlineRemains waits for a server that is
// recovering from a crash.
const recoveryWait = 30 * time.Second

// onlineRemains says what an online upgrade that stopped left in the
// database, read on a new connection (the failed one may be gone), and what
// to run next.
func (a *App) onlineRemains(ctx context.Context, t *target, blocked bool) (text string, phase bool) {
	info, err := a.readOnlineRemains(ctx, t)
	// After a crash the server resets the sessions, then recovers before
	// it takes new ones (57P03); a session opened just before the reset is
	// ended by it. What remains is worth that wait, up to recoveryWait.
	for waited := time.Duration(0); err != nil && (restarting(err) || connectionGone(err)) && waited < recoveryWait && ctx.Err() == nil; waited += 500 * time.Millisecond {
		time.Sleep(500 * time.Millisecond)
		info, err = a.readOnlineRemains(ctx, t)
	}
	switch {
	case err != nil:
		return "; what remains in the database could not be read (" + err.Error() + "): run pgflow-upgrade status", false
	case info == nil:
		return "; nothing of the online upgrade remains in the database", false
	}
	s := info.Shape
	next := "run apply --online again to continue from there, or apply --rollback-online to undo it"
	if blocked {
		next = "once the cause is fixed, apply --online continues from there; apply --rollback-online undoes it"
	}
	return fmt.Sprintf("; remains in the database: the online upgrade at phase %s (queue_name columns %d of %d, insert triggers %d, checks %d (%d validated), unique indexes %d of %d (%d valid); a failed switch rolls back by itself): %s",
		info.Phase, s.Columns, len(online.Tables), s.Triggers, s.Checks, s.ChecksValid, len(s.Indexes), len(online.Indexes), len(s.IndexesValid), next), true
}

// readOnlineRemains reads an online upgrade in progress on a new connection
// (nil: none).
func (a *App) readOnlineRemains(ctx context.Context, t *target) (*online.StatusInfo, error) {
	conn, err := a.connect(context.WithoutCancel(ctx), t)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return onlineStatus(context.WithoutCancel(ctx), conn)
}

func writeOnlineTable(w io.Writer, where string, res *outcome.Result[*online.Report]) error {
	rep := res.Report
	fmt.Fprintf(w, "pgflow-upgrade apply --online on %s: %s (started at phase %s)\n%s\n", where, res.Outcome, rep.StartPhase, res.Message)
	if len(rep.Blockers) > 0 {
		if err := writeBlockers(w, rep.Blockers); err != nil {
			return err
		}
	}
	if len(rep.Phases) > 0 {
		fmt.Fprintln(w)
		var rows [][]string
		for _, p := range rep.Phases {
			rows = append(rows, []string{phaseLabel(p.Phase, p.Detail), fmt.Sprint(p.DurationMS), p.Detail})
		}
		if err := writeTable(w, []string{"phase", "ms", "detail"}, rows); err != nil {
			return err
		}
	}
	b := rep.Backfill
	fmt.Fprintf(w, "backfill: %d rows in %d batches (%s, %.0f rows/s, longest batch %d ms, %d rows retried as locked, %d ms waiting for replicas)\n",
		b.Rows, b.Batches, passText(b), b.Rate, b.LongestMS, b.SkippedLocked, b.ReplicaWaitMS)
	for _, l := range rep.Locks {
		fmt.Fprintf(w, "lock window %s: %d ms (%d attempt(s))\n", l.Step, l.WindowMS, l.Attempts)
	}
	fmt.Fprintf(w, "total %d ms\n", rep.TotalMS)
	if rep.Switch != nil {
		writeQuiesce(w, rep.Switch.Report.Quiesce)
	}
	return nil
}

// onlineStatus reads the online upgrade's state for `status` in a READ
// ONLY transaction with timeouts (catalog and one one-row table).
func onlineStatus(ctx context.Context, conn *pgx.Conn) (*online.StatusInfo, error) {
	tx, err := session.BeginReadOnly(ctx, conn, 10*time.Second, time.Second, "pgflow-upgrade status")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	info, err := online.ReadStatus(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("reading the online upgrade's progress: %w", err)
	}
	if !info.InProgress() {
		return nil, nil // nothing in progress: status says nothing about it
	}
	return info, nil
}

// writeOnlineStatus prints an online upgrade in progress.
func writeOnlineStatus(w io.Writer, info *online.StatusInfo) {
	if info == nil {
		return
	}
	fmt.Fprintf(w, "online upgrade in progress: phase %s; next: %s (continues it), or %s (undoes it)\n", info.Phase, info.Next, info.Undo)
	if p := info.Progress; p != nil {
		fmt.Fprintf(w, "  backfill: %d rows done, ~%d left (of ~%d), pass %d, %d batches, %.0f rows/s, updated %s",
			p.RowsDone, info.RowsLeft, p.RowsTotal, p.Pass, p.Batches, p.Rate, p.UpdatedAt.UTC().Format(time.RFC3339))
		if info.ETASeconds > 0 {
			fmt.Fprintf(w, ", ~%s left at that rate", (time.Duration(info.ETASeconds) * time.Second).Round(time.Second))
		}
		fmt.Fprintln(w)
	}
	s := info.Shape
	fmt.Fprintf(w, "  queue_name columns %d/2, insert triggers %d/2, is_valid_queue_name %v, checks %d/4 (validated %d), unique indexes %d/3 (valid %d)\n",
		s.Columns, s.Triggers, s.Function, s.Checks, s.ChecksValid, len(s.Indexes), len(s.IndexesValid))
}

// passText says which backfill pass this run worked on, as status numbers
// them, and whether it finished it.
func passText(b online.BackfillStats) string {
	switch {
	case b.Pass == 0:
		return "no pass of step_tasks in this run"
	case b.Passes == 0:
		return fmt.Sprintf("pass %d, not finished", b.Pass)
	case b.Passes == 1:
		return fmt.Sprintf("pass %d, finished", b.Pass)
	}
	return fmt.Sprintf("%d passes finished, the last pass %d", b.Passes, b.Pass)
}
