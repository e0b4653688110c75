package cli

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/calibrate"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// calibrateTimeout bounds the sample calibration (generation and both
// applies at its sizes take seconds to a minute on a loaded 2-core machine).
const calibrateTimeout = 10 * time.Minute

func forecastFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "calibration", Usage: "forecast from this calibration `FILE` (written by `fixtures replay --from CAPTURE --calibration-out FILE`, or by --calibration-out here)"},
		&ucli.StringFlag{Name: "calibrate-dsn", Usage: "measure the forecast's costs on a generated sample in a throwaway database created (and dropped) on this scratch server `DSN` (a role that may CREATE DATABASE; never the audited database)"},
		&ucli.BoolFlag{Name: "calibrate-local", Usage: "measure the forecast's costs on a generated sample in an ephemeral local cluster (needs this machine's PostgreSQL server binaries)"},
		&ucli.StringFlag{Name: "calibrate-rows", Value: defaultCalibrateRows(), Usage: "step_tasks rows of the sample sizes, comma separated (two sizes: a fixed and a per-row cost)"},
		&ucli.StringFlag{Name: "calibration-out", Usage: "write the sample's measured calibration to `FILE` (reuse it with --calibration)"},
		&ucli.DurationFlag{Name: "online-threshold", Value: forecast.DefaultOnlineThreshold, Usage: "recommend apply --online when the forecast lock window of a transactional apply is above this"},
	}
}

// defaultCalibrateRows is calibrate.DefaultRows as --calibrate-rows spells it.
func defaultCalibrateRows() string {
	sizes := make([]string, len(calibrate.DefaultRows))
	for i, n := range calibrate.DefaultRows {
		sizes[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(sizes, ",")
}

// forecastPlan is what the forecast flags ask for, validated before the
// audit connects (a bad flag or calibration file is a usage error, exit 2).
type forecastPlan struct {
	threshold   time.Duration
	file        string
	calibration *forecast.Calibration
	measureDSN  string // --calibrate-dsn
	local       bool   // --calibrate-local
	rows        []int64
	out         string
}

func parseForecastFlags(c *ucli.Context) (*forecastPlan, error) {
	p := &forecastPlan{threshold: c.Duration("online-threshold"), file: c.String("calibration"),
		measureDSN: c.String("calibrate-dsn"), local: c.Bool("calibrate-local"), out: c.String("calibration-out")}
	if p.threshold <= 0 {
		return nil, usageErrorf("--online-threshold %s: must be positive", p.threshold)
	}
	sources := 0
	for _, set := range []bool{p.file != "", p.measureDSN != "", p.local} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return nil, usageErrorf("--calibration, --calibrate-dsn and --calibrate-local are alternatives: give one")
	}
	if p.out != "" && p.measureDSN == "" && !p.local {
		return nil, usageErrorf("--calibration-out %s: only a measured sample (--calibrate-dsn or --calibrate-local) writes a calibration", p.out)
	}
	for _, s := range strings.Split(c.String("calibrate-rows"), ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil || n <= 0 {
			return nil, usageErrorf("--calibrate-rows %q: want positive row counts separated by commas (e.g. 40000,200000)", c.String("calibrate-rows"))
		}
		p.rows = append(p.rows, n)
	}
	if p.file != "" {
		cal, err := forecast.ReadCalibration(p.file)
		if err != nil {
			return nil, withCode(ExitUsage, fmt.Errorf("--calibration: %w", err))
		}
		p.calibration = &cal
	}
	if p.measureDSN != "" {
		if _, err := session.ParseConfig(p.measureDSN); err != nil {
			return nil, withCode(ExitUsage, fmt.Errorf("--calibrate-dsn: %s", session.RedactText(err.Error(), p.measureDSN)))
		}
	}
	return p, nil
}

// noCostsReason: what to do for a forecast when none of its sources is given.
const noCostsReason = "no per-row costs to forecast with: pass --calibration FILE (a rehearsal's: `fixtures replay --from CAPTURE --calibration-out FILE`), " +
	"or measure them on a generated sample with --calibrate-dsn DSN (a scratch server) or --calibrate-local (an ephemeral cluster)"

// runForecast reads the row counts (read-only, the audit's budgets) and
// estimates with the plan's costs, hop by hop from the release found to
// upstream's newest. It never fails the audit: what goes wrong is the
// forecast's Reason.
func (a *App) runForecast(ctx context.Context, conn *pgx.Conn, rep *audit.Report, p *forecastPlan, checkTimeout, lockTimeout time.Duration) *forecast.Forecast {
	v := rep.PgflowVersion
	from, onTheWay := planStart(v)
	if v != nil && !onTheWay && (v.State == versions.StateUpgraded || v.State == versions.StateNotPgflow || v.State == versions.StateOlder) {
		return forecast.Unavailable(nil, p.threshold, fmt.Sprintf("no forecast: pgflow is %s (state %s), not a release this tool takes to %s", orNone(v.Found), v.State, versions.Newest))
	}
	stats, err := forecast.ReadStats(ctx, conn, checkTimeout, lockTimeout)
	if err != nil {
		return forecast.Unavailable(nil, p.threshold, "no forecast: "+err.Error())
	}
	if !onTheWay {
		// An unfinished online upgrade, or a 0.16.0 whose release could not
		// be told exactly: the own hop's estimate, without the hop list.
		return a.ownHopForecast(ctx, stats, p, versions.OwnHopFile-1)
	}
	f := a.ownHopForecast(ctx, stats, p, from)
	f.Hops = forecast.PerHop(stats, from, f)
	return f
}

// planStart is the number of upstream's files the database holds, when a
// plan to the newest release may start there.
func planStart(v *versions.Detection) (int, bool) {
	if !v.PlanStarts() {
		return 0, false
	}
	return v.Release.Files, true
}

// ownHopForecast estimates this tool's own hop (0.16.0 -> 0.17.0), the one
// whose lock window grows with the rows, from the plan's costs; a plan
// without it needs no estimate.
func (a *App) ownHopForecast(ctx context.Context, stats forecast.Stats, p *forecastPlan, from int) *forecast.Forecast {
	if from >= versions.OwnHopFile {
		return forecast.Unavailable(&stats, p.threshold, "no lock-window estimate needed: no hop of this plan holds a lock for work that grows with the rows "+
			"(each is catalog work in the transaction, or built beforehand while reads and writes go on; per hop below)")
	}
	switch {
	case p.calibration != nil:
		b, err := forecast.BasisOf(forecast.BasisFile, p.file+" ("+p.calibration.Source+")", *p.calibration)
		if err != nil {
			return forecast.Unavailable(&stats, p.threshold, "no forecast: "+err.Error())
		}
		return forecast.Estimate(stats, b, p.threshold)
	case p.measureDSN != "" || p.local:
		cal, err := a.measureSample(ctx, p)
		if err != nil {
			what := "pass --calibration FILE from a rehearsal, or a --calibrate-dsn of a server where this role may CREATE DATABASE"
			return forecast.Unavailable(&stats, p.threshold, "no forecast: the sample calibration failed: "+a.redactAll(err.Error(), p.measureDSN)+"; "+what)
		}
		if p.out != "" {
			if err := forecast.WriteCalibration(p.out, cal); err != nil {
				fmt.Fprintf(a.Stderr, "pgflow-upgrade: note: %v\n", err)
			}
		}
		b, err := forecast.BasisOf(forecast.BasisSample, cal.Source, cal)
		if err != nil {
			return forecast.Unavailable(&stats, p.threshold, "no forecast: "+err.Error())
		}
		return forecast.Estimate(stats, b, p.threshold)
	}
	return forecast.Unavailable(&stats, p.threshold, noCostsReason)
}

// noteSameServer warns when the place to measure is the audited
// database's server: the sample gets databases of its own, but its load
// (generation, two applies) lands on that server.
func (a *App) noteSameServer(p *forecastPlan, t *target) {
	if p.measureDSN == "" || t.config == nil {
		return
	}
	cfg, err := session.ParseConfig(p.measureDSN)
	if err == nil && cfg.Host == t.config.Host && cfg.Port == t.config.Port {
		fmt.Fprintln(a.Stderr, "pgflow-upgrade: note: --calibrate-dsn names the audited database's server: the sample runs in throwaway databases of its own, "+
			"but its load (generating rows, two applies) lands on that server; prefer a scratch server")
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// measureSample opens the place to measure (never the audited database)
// and runs the sample there.
func (a *App) measureSample(ctx context.Context, p *forecastPlan) (forecast.Calibration, error) {
	ctx, cancel := context.WithTimeout(ctx, calibrateTimeout)
	defer cancel()
	logf := func(f string, args ...any) { fmt.Fprintf(a.Stderr, "pgflow-upgrade: "+f+"\n", args...) }
	srv, err := pgprovider.Open(ctx, pgprovider.Options{DSN: p.measureDSN, SkipDocker: true, Logf: logf})
	if err != nil {
		if p.local {
			return forecast.Calibration{}, fmt.Errorf("starting an ephemeral cluster: %w (install the PostgreSQL server binaries, or use --calibrate-dsn)", err)
		}
		return forecast.Calibration{}, err
	}
	defer srv.Close()
	return calibrate.Measure(ctx, srv, calibrate.Options{Rows: p.rows, Logf: logf})
}

func (a *App) redactAll(text, extra string) string {
	if extra != "" {
		text = session.RedactText(text, extra)
	}
	return a.redact(text)
}

// writeForecast prints the forecast section of the audit's table.
func writeForecast(w *bytes.Buffer, f *forecast.Forecast) {
	if f == nil {
		return
	}
	fmt.Fprintln(w)
	if r := f.Rows; r != nil {
		analyzed := "never analyzed"
		if r.LastAnalyzed != nil {
			analyzed = "analyzed " + r.LastAnalyzed.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "forecast: pgflow.step_tasks about %d rows, step_states %d, runs %d (statistics: %s; %s)\n",
			r.StepTasks, r.StepStates, r.Runs, r.Source, analyzed)
	} else {
		fmt.Fprintln(w, "forecast:")
	}
	defer writeHops(w, f.Hops)
	if !f.Available {
		fmt.Fprintf(w, "  unavailable: %s\n", f.Reason)
		return
	}
	b := f.Basis
	source := b.Source // a sample's reads "sample of N and M generated rows on ..."
	if b.Kind == forecast.BasisFile {
		source = "calibration file " + source
	}
	fmt.Fprintf(w, "  basis: %s, PostgreSQL %s, measured %s; %s\n", source, orNone(b.Server), b.MeasuredAt.Format(time.RFC3339), b.Method)
	fmt.Fprintf(w, "  transactional apply: locks held about %s (%s)\n", msText(f.LockWindowMS), costText(b.LockWindow))
	if f.OnlineTotalMS != nil && b.Online != nil {
		fmt.Fprintf(w, "  apply --online: about %s in all (%s)\n", msText(*f.OnlineTotalMS), costText(*b.Online))
	} else {
		fmt.Fprintln(w, "  apply --online: no estimate (the calibration has no --online timing)")
	}
	if f.Caveat != "" {
		fmt.Fprintf(w, "  caveat: %s\n", f.Caveat)
	}
	fmt.Fprintf(w, "  recommendation: %s\n", f.Recommendation)
}

func msText(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}

func costText(c forecast.Cost) string {
	return fmt.Sprintf("fixed %.0f ms + %.3g µs per step_tasks row", c.FixedMS, c.PerRowUS)
}

// writeHops prints the forecast of every hop, one block each.
func writeHops(w *bytes.Buffer, hops []forecast.HopForecast) {
	if len(hops) == 0 {
		return
	}
	fmt.Fprintf(w, "  per hop (%d, to %s):\n", len(hops), versions.Newest)
	for i, h := range hops {
		writeBlock(w, fmt.Sprintf("    %d. %s: ", i+1, h.Hop), h.Summary, 8)
	}
}

// writeHopsLine is the per-hop forecast in one line.
func writeHopsLine(w *bytes.Buffer, hops []forecast.HopForecast) {
	if len(hops) == 0 {
		return
	}
	inTx, before := 0, 0
	for _, h := range hops {
		for _, l := range h.Locks {
			if l.Run == versions.Beforehand {
				before++
			} else {
				inTx++
			}
		}
	}
	fmt.Fprintln(w, oneLine(fmt.Sprintf("forecast per hop: %d hops to %s; %d locking statements in the transaction, %d built beforehand online (--verbose lists them)",
		len(hops), versions.Newest, inTx, before), lineWidth))
}

func hasOwnHop(hops []forecast.HopForecast) bool {
	for _, h := range hops {
		if h.Own {
			return true
		}
	}
	return false
}
