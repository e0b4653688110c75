// Package calibrate measures the per-row costs of the audit's forecast: it
// builds throwaway databases from a generated sample (internal/datagen on
// the real 0.16.0 baseline), runs a transactional apply and an apply
// --online on copies of each, and returns the timings as a
// forecast.Calibration. It only ever creates and drops its own databases on
// the server it is given, never the audited one.
package calibrate

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// DefaultRows are the two sample sizes (step_tasks rows): two, so the
// forecast fits a fixed cost and a per-row cost.
var DefaultRows = []int64{40_000, 200_000}

// Options of Measure.
type Options struct {
	Rows []int64 // sample sizes (default DefaultRows); at least two distinct for a fit
	Logf func(format string, args ...any)
}

// Measure runs the sample on srv and returns what it measured.
func Measure(ctx context.Context, srv *pgprovider.Server, opts Options) (forecast.Calibration, error) {
	if len(opts.Rows) == 0 {
		opts.Rows = DefaultRows
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	c := forecast.Calibration{Format: forecast.CalibrationFormat, MeasuredAt: time.Now().UTC(), ServerVersion: srv.Version}
	var sizes []string
	for _, n := range opts.Rows {
		if n <= 0 {
			return c, fmt.Errorf("calibration sample size %d: must be positive", n)
		}
		p, err := measureSize(ctx, srv, n, opts.Logf)
		if err != nil {
			return c, fmt.Errorf("calibrating on a sample of %d step_tasks rows on %s: %w", n, srv.Describe(), err)
		}
		c.Points = append(c.Points, p.Point)
		sizes = append(sizes, fmt.Sprint(n))
		if n >= c.StepTasks { // the top-level figures: the largest size
			c.StepTasks, c.LockWindowMS, c.ApplyTotalMS, c.OnlineTotalMS = n, p.LockWindowMS, p.applyTotalMS, p.OnlineTotalMS
			c.StepStates, c.Steps, c.Flows = p.stepStates, p.steps, p.flows
		}
	}
	c.Source = fmt.Sprintf("sample of %s generated step_tasks rows on %s", strings.Join(sizes, " and "), srv.Describe())
	return c, nil
}

type measured struct {
	forecast.Point
	applyTotalMS             float64
	stepStates, steps, flows int64
}

// measureSize generates n rows once (a template), then applies on two
// copies of it: transactionally, and --online.
func measureSize(ctx context.Context, srv *pgprovider.Server, n int64, logf func(string, ...any)) (m measured, err error) {
	tpl, took, err := datagen.Template(ctx, srv, "pgflow_calibrate_tpl", n)
	if err != nil {
		return m, fmt.Errorf("building the sample: %w", err)
	}
	defer func() { _ = srv.DropTemplate(context.WithoutCancel(ctx), tpl) }()
	logf("calibrate: generated %d step_tasks rows in %s", n, took.Round(time.Millisecond))
	m.StepTasks = n

	err = onCopy(ctx, srv, tpl, func(conn *pgx.Conn) error {
		if err := conn.QueryRow(ctx, `select (select count(*) from pgflow.step_states), (select count(*) from pgflow.steps),
		                                     (select count(*) from pgflow.flows)`).Scan(&m.stepStates, &m.steps, &m.flows); err != nil {
			return fmt.Errorf("counting the sample's rows: %w", err)
		}
		start := time.Now()
		rep, err := upgrade.Apply(ctx, conn, upgrade.Options{})
		if err != nil {
			return fmt.Errorf("transactional apply: %w", err)
		}
		if err := rep.Want(outcome.Applied); err != nil {
			return fmt.Errorf("transactional apply: %w", err)
		}
		m.applyTotalMS = ms(time.Since(start))
		// Sub-millisecond windows are reported as 0 ms; never a zero cost.
		m.LockWindowMS = max(float64(rep.Report.LockWindowMS), 1)
		return nil
	})
	if err != nil {
		return m, err
	}
	err = onCopy(ctx, srv, tpl, func(conn *pgx.Conn) error {
		start := time.Now()
		rep, err := online.Upgrade(ctx, conn, online.Options{})
		if err != nil {
			return fmt.Errorf("apply --online: %w", err)
		}
		if err := rep.Want(outcome.Applied); err != nil {
			return fmt.Errorf("apply --online: %w", err)
		}
		m.OnlineTotalMS = ms(time.Since(start))
		return nil
	})
	logf("calibrate: %d step_tasks rows: lock window %.0f ms, apply --online %.0f ms", n, m.LockWindowMS, m.OnlineTotalMS)
	return m, err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// onCopy runs fn on a fresh copy of tpl, then drops the copy.
func onCopy(ctx context.Context, srv *pgprovider.Server, tpl string, fn func(conn *pgx.Conn) error) error {
	name := pgprovider.RandomName("pgflow_calibrate")
	if err := srv.CreateDatabase(ctx, name, tpl); err != nil {
		return err
	}
	defer func() { _ = srv.DropDatabase(context.WithoutCancel(ctx), name) }()
	// The tool's own SQL on the copy: a rehearsal session, pinned as the CLI's.
	conn, err := session.Open(ctx, srv.DSNFor(name), session.Rehearsal)
	if err != nil {
		return fmt.Errorf("connecting to the sample copy: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}
