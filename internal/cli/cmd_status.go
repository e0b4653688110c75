package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/queueroutes"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// statusRouteTimeout bounds status's read of the routes (statement_timeout),
// as its catalog read is bounded.
const statusRouteTimeout = 10 * time.Second

func (a *App) statusCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "status",
		Usage: "the pgflow version found (a release from 0.14.1 to upstream's newest, an online upgrade in progress, unknown: what differs) with the next step, applied revisions, pending migrations, atlas.sum validity; on 0.17, every queue route with its depth and live workers",
		Description: "Read-only: catalog queries, pgflow_upgrade.schema_revisions and, on pgflow 0.17, the queue routes\n" +
			"(pgflow.flows, pgflow.steps, the pgmq queue tables, pgflow.workers), in READ ONLY transactions with\n" +
			"statement_timeout and lock_timeout set.\n" +
			"Exit codes: 0 a release from 0.14.1 to upstream's newest, an online upgrade of ours in progress, or not pgflow;\n" +
			"1 older than 0.16.0 and not told exactly,\n" +
			"partial/unknown schema, embedded migrations not matching atlas.sum, or an apply --quiesce record left open;\n" +
			"3 connection error. A route without a worker does not change it: verify --routes does.",
		Flags: []ucli.Flag{
			&ucli.BoolFlag{Name: "verbose", Usage: "also the embedded migrations' table and the schema's differences in full (JSON always has all)"},
		},
		Action: a.statusAction,
	}
}

// statusJSON is status's --format json document after command, database
// and exit_code (writeCommandJSON).
type statusJSON struct {
	*upgrade.StatusReport
	Online  *online.StatusInfo  `json:"online,omitempty"`
	Quiesce *quiesce.StatusInfo `json:"quiesce,omitempty"`
	// Routes: on a 0.17 database, every queue route (queueroutes.Report).
	Routes *routesResult `json:"routes,omitempty"`
}

func (a *App) statusAction(c *ucli.Context) error {
	conn, where, err := a.connectNoArgs(c, "status")
	if err != nil {
		return err
	}
	ctx := c.Context
	defer conn.Close(ctx)
	st, err := upgrade.Status(ctx, conn)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	on, err := onlineStatus(ctx, conn) // cmd_apply_online.go
	if err != nil {
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	if !on.Annotate(st.PgflowVersion) { // an online upgrade in progress: its phase and how to continue
		on = nil // e.g. a 0.17.x database: its queue_name column is no backfill of ours
	}
	qs, err := quiesceStatus(ctx, conn) // cmd_apply_quiesce.go
	if err != nil {
		return withCode(ExitEnvironment, fmt.Errorf("reading the status of %s: %w", where, err))
	}
	var rr *routesResult
	if st.State.State == versions.SchemaUpgraded {
		rr = &routesResult{}
		rr.Report, err = queueroutes.Read(ctx, conn, queueroutes.Options{StatementTimeout: statusRouteTimeout, ApplicationName: "pgflow-upgrade status"})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.As(err, new(*session.LostError)) {
				return withCode(ExitEnvironment, fmt.Errorf("reading the routes of %s: %w", where, err))
			}
			rr.Error = err.Error() // shown; the routes do not decide status's exit code
		}
	}
	code := ExitOK
	if (st.NeedsAttention() && on == nil) || qs != nil {
		code = ExitFindings // an online upgrade in progress is a known partial state; a recorded quiesce has functions disabled
	}
	if jsonOutput(c) {
		if err := writeCommandJSON(a.Stdout, "status", where, code, statusJSON{st, on, qs, rr}); err != nil {
			return err
		}
	} else if err := writeStatus(a.Stdout, where, st, on, qs, rr, c.Bool("verbose")); err != nil {
		return err
	}
	if code != ExitOK {
		return reportedError{withCode(code, errors.New("status needs attention"))}
	}
	return nil
}

// writeStatus prints the version and the next step on the first line, then
// what is in progress, the migrations and, on 0.17, the routes.
func writeStatus(w io.Writer, where string, st *upgrade.StatusReport, on *online.StatusInfo, qs *quiesce.StatusInfo, rr *routesResult, verbose bool) error {
	writeBlock(w, "pgflow version: ", versionSummary(st.PgflowVersion)+"; next step: "+statusNextStep(st.PgflowVersion, rr), 2)
	fmt.Fprintf(w, "status of %s\n", where)
	fmt.Fprintf(w, "schema state: %s\n", st.State.State)
	writeBlock(w, "pgmq: ", pgmqStatusLine(st.PGMQ), 2)
	diffs := st.State.Differences
	if !verbose && len(diffs) > 10 {
		diffs = diffs[:10]
	}
	for _, d := range diffs {
		fmt.Fprintf(w, "  %s\n", d)
	}
	if n := len(st.State.Differences) - len(diffs); n > 0 {
		fmt.Fprintf(w, "  … and %d more (--verbose)\n", n)
	}
	writeOnlineStatus(w, on)
	writeQuiesceStatus(w, qs)

	var rows [][]string
	for _, m := range st.Migrations {
		rows = append(rows, []string{m.Version, m.Name, m.Status})
	}
	// Revisions the database has that this binary does not embed.
	for _, r := range st.Applied {
		known := false
		for _, m := range st.Migrations {
			known = known || m.Version == r.Version
		}
		if !known {
			rows = append(rows, []string{r.Version, r.Name, "applied (not embedded in this binary)"})
		}
	}
	sum := "valid"
	if !st.AtlasSum.Valid {
		sum = "INVALID: " + st.AtlasSum.Error
	}
	if verbose {
		fmt.Fprintf(w, "embedded migrations: atlas.sum %s (%s)\n", sum, migrations.Hash())
		if err := writeTable(w, []string{"version", "name", "status"}, rows); err != nil {
			return err
		}
	} else {
		if !st.AtlasSum.Valid {
			fmt.Fprintf(w, "embedded migrations: atlas.sum %s\n", sum)
		}
		for _, r := range rows {
			fmt.Fprintf(w, "migration %s_%s: %s\n", r[0], r[1], r[2])
		}
	}
	if len(st.Pending) > 0 {
		fmt.Fprintf(w, "pending: %s\n", strings.Join(st.Pending, ", "))
	} else {
		fmt.Fprintln(w, "pending: none")
	}
	if rr == nil {
		return nil
	}
	fmt.Fprintln(w)
	if rr.Report == nil {
		writeBlock(w, "routes: cannot tell: ", rr.Error+"; "+routesErrorRemedy(rr.Error), 2)
		return nil
	}
	if len(rr.Routes) == 0 {
		fmt.Fprintln(w, "routes: none (no flow is defined)")
		return nil
	}
	fmt.Fprintf(w, "routes: %s, %d without a worker that can claim (a worker is live with a heartbeat within %s)\n",
		plural(len(rr.Routes), "route", "routes"), len(rr.Findings), time.Duration(rr.LiveWindowMS)*time.Millisecond)
	return writeRoutesTable(w, rr.Report)
}

// versionSummary is the version found, as status and audit name it.
func versionSummary(d *versions.Detection) string {
	if d == nil {
		return "unknown"
	}
	return d.Summary()
}

// statusNextStep is the detection's next step, or, on an upgraded database
// with routes that no worker can serve, the deploy that is missing.
func statusNextStep(d *versions.Detection, rr *routesResult) string {
	if rr != nil && rr.Report != nil && len(rr.Findings) > 0 {
		return fmt.Sprintf("deploy a worker for the %s below, then `pgflow-upgrade verify --routes`",
			plural(len(rr.Findings), "route", "routes"))
	}
	if d == nil {
		return "none"
	}
	return withoutSelf(d.NextStep, "status")
}

// writeRoutesTable prints one row per route: flow, queue mode, step (or
// "all steps"), queue, depth (visible / hidden), the oldest message's age
// and the live workers by function name, with their pgflow version where
// known.
func writeRoutesTable(w io.Writer, rep *queueroutes.Report) error {
	var rows [][]string
	for _, r := range rep.Routes {
		depth, age := "-", "-"
		switch {
		case !r.QueueExists:
			depth = "no queue"
		case r.Error != "":
			depth = "unreadable"
		default:
			depth = fmt.Sprintf("%d / %d", r.Visible, r.Hidden)
			if r.OldestEnqueuedAt != nil {
				age = shortAge(r.OldestAge(rep.ReadAt))
			}
		}
		rows = append(rows, []string{r.Flow, r.QueueMode, r.StepLabel(), r.Queue, depth, age, workersCell(r)})
	}
	return writeTable(w, []string{"flow", "mode", "step", "queue", "visible/hidden", "oldest", "live workers"}, rows)
}

// workersCell names a route's live workers, each function once with how
// many run it; NONE when there is no live worker.
func workersCell(r queueroutes.Route) string {
	if len(r.Workers) == 0 {
		if r.State == queueroutes.StateNoWorker {
			return "NONE (messages waiting)"
		}
		return "none"
	}
	count := map[string]int{}
	var labels []string
	for _, wk := range r.Workers {
		l := wk.Label()
		if count[l] == 0 {
			labels = append(labels, l)
		}
		count[l]++
	}
	sort.Strings(labels)
	var parts []string
	for _, l := range labels {
		if count[l] > 1 {
			l = fmt.Sprintf("%s ×%d", l, count[l])
		}
		parts = append(parts, l)
	}
	return strings.Join(parts, ", ")
}

// shortAge is a duration as a person reads an age: 45s, 12m3s, 5h2m, 3d4h.
func shortAge(d time.Duration) string {
	switch {
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
	days := int(d / (24 * time.Hour))
	return fmt.Sprintf("%dd%dh", days, int((d%(24*time.Hour))/time.Hour))
}

// writeVersion prints the pgflow version found and the next step (apply
// prints them so; audit and status open with them in their first lines).
func writeVersion(w io.Writer, d *versions.Detection) {
	if d == nil {
		return
	}
	fmt.Fprintf(w, "pgflow version: %s\nnext step: %s\n", d.Summary(), d.NextStep)
}

// pgmqStatusLine names the pgmq found and, when the server offers a newer
// one, how to take it there.
func pgmqStatusLine(p pgmqver.Found) string {
	line := p.String()
	cur, err1 := pgmqver.Parse(p.Version)
	newest, err2 := pgmqver.Parse(p.Newest)
	switch {
	case p.Kind != "extension" || err1 != nil:
	case pgmqver.BreaksClaim(cur):
		line += "; pgmq 1.10.0/1.10.1 breaks read, pop and set_vt on queues made before 1.10.0: `pgflow-upgrade apply --pgmq 1.13.1` (audit: pgmq.claim_path)"
	case err2 == nil && cur.Less(newest):
		line += "; the server offers " + newest.String() + ": `pgflow-upgrade audit` says whether the update goes through (pgmq.update_path), `pgflow-upgrade apply --pgmq " + newest.String() + "` runs it"
	}
	return line
}
