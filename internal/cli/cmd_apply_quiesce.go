package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// quiesceFlags are apply's flags for upstream's stop-and-resume steps done
// by the tool (internal/quiesce; docs/runbook.md).
func quiesceFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.BoolFlag{Name: "quiesce", Usage: "around the transaction (with --online: around its switch): record and disable worker_functions.enabled and pause pgflow's cron jobs, deprecate the live 0.16.0 workers and wait for their started tasks, apply, then restore every recorded value exactly (with --dry-run: only say what it would change)"},
		&ucli.DurationFlag{Name: "drain-timeout", Value: quiesce.DefaultDrainTimeout, Usage: "--quiesce: how long to wait for tasks started by live workers (then restore and exit 1, nothing upgraded)"},
		&ucli.BoolFlag{Name: "resume-quiesce", Usage: "finish a quiesce an interrupted apply --quiesce left recorded (status shows it): continue from its phase, apply, restore"},
		&ucli.BoolFlag{Name: "undo-quiesce", Usage: "restore every value an interrupted apply --quiesce recorded (status shows it), without upgrading"},
	}
}

// checkQuiesceFlags refuses (exit 2) combinations that make no sense.
func checkQuiesceFlags(c *ucli.Context) error {
	q, resume, undo := c.Bool("quiesce"), c.Bool("resume-quiesce"), c.Bool("undo-quiesce")
	switch {
	case undo && (q || resume || c.Bool("dry-run") || c.Bool("online") || c.Bool("rollback-online")):
		return usageErrorf("--undo-quiesce restores a recorded quiesce and does nothing else: it excludes --quiesce, --resume-quiesce, --dry-run, --online and --rollback-online")
	case resume && c.Bool("dry-run"):
		return usageErrorf("--resume-quiesce continues a recorded quiesce and cannot be a dry run; `pgflow-upgrade status` shows where it stands")
	case (q || resume) && c.Bool("rollback-online"):
		return usageErrorf("--quiesce and --resume-quiesce exclude --rollback-online")
	case c.IsSet("drain-timeout") && !q && !resume:
		return usageErrorf("--drain-timeout is for --quiesce or --resume-quiesce")
	case c.Duration("drain-timeout") <= 0:
		return usageErrorf("--drain-timeout must be positive")
	}
	return nil
}

// quiesceOptions: the options for upgrade.Options.Quiesce (nil: not asked).
func (a *App) quiesceOptions(c *ucli.Context, mode string) *quiesce.Options {
	if !c.Bool("quiesce") && !c.Bool("resume-quiesce") {
		return nil
	}
	o := &quiesce.Options{Mode: mode, Resume: c.Bool("resume-quiesce"), DrainTimeout: c.Duration("drain-timeout")}
	if a.Interactive {
		w := a.Stderr
		var last string
		var at time.Time
		o.Progress = func(e quiesce.Event) {
			// The drain polls often: print a change, or every 5 s.
			if e.Step == "drain" && e.Detail == last && time.Since(at) < 5*time.Second {
				return
			}
			last, at = e.Detail, time.Now()
			fmt.Fprintf(w, "- quiesce %s: %s\n", e.Step, e.Detail)
		}
	}
	return o
}

// undoQuiesceAction is apply --undo-quiesce.
func (a *App) undoQuiesceAction(c *ucli.Context) error {
	if !c.Bool("yes") && !a.Interactive {
		return usageErrorf("apply --undo-quiesce changes the database: pass --yes (pipelines), or run it on a terminal")
	}
	ctx := c.Context
	conn, t, err := a.openTarget(c, "apply")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	where := session.Describe(t.config)
	res, err := upgrade.UndoQuiesce(ctx, conn)
	return finishRun(a, c, "apply --undo-quiesce", where, res, err, func(w io.Writer) error {
		fmt.Fprintf(w, "pgflow-upgrade apply --undo-quiesce on %s: %s\n", where, a.redact(res.Message))
		writeQuiesceItems(w, res.Report.Quiesce)
		return nil
	})
}

// writeQuiesce prints what apply --quiesce did (or, dry run, would do).
func writeQuiesce(w io.Writer, q *upgrade.QuiesceReport) {
	if q == nil {
		return
	}
	if len(q.Plan) > 0 {
		fmt.Fprintln(w, "\n--quiesce would (dry run: nothing was paused, nothing is restored):")
		for _, p := range q.Plan {
			fmt.Fprintf(w, "  %s\n", p)
		}
		return
	}
	if q.Report == nil {
		return
	}
	r := q.Report
	fmt.Fprintf(w, "\nquiesce: %d value(s) recorded, %d 0.16.0 worker(s) deprecated, drained in %s, upgrade committed %v, restored %v\n",
		len(r.Recorded), r.WorkersDeprecated, (time.Duration(r.DrainMS) * time.Millisecond).Round(time.Millisecond), r.Applied, r.Restored)
	writeQuiesceItems(w, r)
	writeLeftStarted(w, r.LeftStarted)
	if r.Next != "" {
		fmt.Fprintf(w, "the quiesce is still recorded: run `%s`, or `pgflow-upgrade apply --undo-quiesce --yes`\n", r.Next)
	}
}

func writeQuiesceItems(w io.Writer, r *quiesce.Report) {
	if r == nil {
		return
	}
	for _, it := range r.Recorded {
		name := it.Name
		if it.Label != "" {
			name += " " + it.Label
		}
		what := "enabled"
		if it.Kind == quiesce.KindCronJob {
			what = "active"
		}
		fmt.Fprintf(w, "  %s %s: %s recorded %v\n", it.Kind, name, what, it.Recorded)
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(w, "  gone before the restore (nothing to restore): %s\n", strings.Join(r.Missing, ", "))
	}
}

// quiesceStatus reads a quiesce in progress for `status` (nil: none).
func quiesceStatus(ctx context.Context, conn *pgx.Conn) (*quiesce.StatusInfo, error) {
	tx, err := session.BeginReadOnly(ctx, conn, 10*time.Second, time.Second, "pgflow-upgrade status")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	info, err := quiesce.ReadInProgress(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("reading the recorded quiesce: %w", err)
	}
	return info, nil
}

// writeQuiesceStatus prints a quiesce in progress.
func writeQuiesceStatus(w io.Writer, info *quiesce.StatusInfo) {
	if info == nil {
		return
	}
	fmt.Fprintf(w, "apply --quiesce in progress since %s: phase %s (%d worker function(s) disabled, %d cron job(s) paused, %d worker(s) deprecated); next: %s (finishes it), or %s (undoes it)\n",
		info.StartedAt.UTC().Format(time.RFC3339), info.Phase, info.Functions, info.CronJobs, info.WorkersDeprecated, info.Next, info.Undo)
}

// writeLeftStarted says which tasks were still started when the upgrade
// committed, whose, since when, and what becomes of them.
func writeLeftStarted(w io.Writer, l *quiesce.LeftStarted) {
	if l == nil || (l.Tasks == 0 && l.Recovery == "") {
		return
	}
	if l.Tasks == 0 {
		writeBlock(w, "started tasks: ", l.Recovery, 2)
		return
	}
	writeBlock(w, "", l.Summary()+": "+l.Recovery, 2)
	for _, s := range l.Workers {
		who := "no worker recorded"
		if s.WorkerID != "" {
			who = "worker " + s.WorkerID
			if s.Function != "" {
				who += " (" + s.Function + ")"
			}
			if s.LastHeartbeat != nil {
				who += ", last heartbeat " + s.LastHeartbeat.UTC().Format(time.RFC3339)
			}
		}
		line := fmt.Sprintf("  %d task(s) of %s: started since %s, requeued from %s", s.Tasks, who,
			s.OldestStarted.UTC().Format(time.RFC3339), s.RequeueFrom.UTC().Format(time.RFC3339))
		if s.Exhausted > 0 {
			line += fmt.Sprintf(" (%d requeued 3 times already: left started)", s.Exhausted)
		}
		fmt.Fprintln(w, line)
	}
}
