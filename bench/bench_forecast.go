package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/calibrate"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/forecast"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// forecast: the audit's forecast (a sample calibration at the default sizes,
// on the same server) against the measured transactional apply and apply
// --online, on fresh copies of each size.
func init() {
	Register(Benchmark{
		Name: "forecast",
		Goal: "audit forecast (sample calibration at the default sizes, statistics of the database) within 2x of the measured lock window of apply and total of apply --online",
		Run:  benchForecast,
	})
}

func benchForecast(ctx context.Context, env *Env) ([]Row, error) {
	start := time.Now()
	cal, err := calibrate.Measure(ctx, env.Server, calibrate.Options{Logf: env.Logf})
	if err != nil {
		return nil, err
	}
	basis, err := forecast.BasisOf(forecast.BasisSample, cal.Source, cal)
	if err != nil {
		return nil, err
	}
	env.Logf("bench: forecast calibration in %s: lock %+v, online %+v", time.Since(start).Round(time.Second), basis.LockWindow, basis.Online)
	rows := []Row{{Benchmark: "forecast", Case: "sample calibration (" + basis.Method + ")", Metrics: []Metric{
		{"took", time.Since(start).Seconds(), "s"},
		{"lock fixed", basis.LockWindow.FixedMS, "ms"}, {"lock per row", basis.LockWindow.PerRowUS, "µs"},
		{"online fixed", basis.Online.FixedMS, "ms"}, {"online per row", basis.Online.PerRowUS, "µs"},
	}}}
	for _, size := range env.Sizes {
		var est *forecast.Forecast
		var window, onlineTook time.Duration
		err := onClone(ctx, env, size, func(conn *pgx.Conn) error {
			stats, err := forecast.ReadStats(ctx, conn, time.Minute, time.Second)
			if err != nil {
				return err
			}
			est = forecast.Estimate(stats, basis, forecast.DefaultOnlineThreshold)
			rep, err := upgrade.Apply(ctx, conn, upgrade.Options{})
			if err != nil {
				return err
			}
			window = time.Duration(rep.Report.LockWindowMS) * time.Millisecond
			return rep.Want(outcome.Applied)
		})
		if err != nil {
			return nil, fmt.Errorf("forecast, apply at %d rows: %w", size, err)
		}
		fLock := float64(est.LockWindowMS) / 1000
		env.Logf("bench: forecast at %d: lock %.1fs vs %.1fs measured, recommend online %v", size, fLock, window.Seconds(), est.RecommendOnline)
		rows = append(rows, Row{Benchmark: "forecast", Case: fmt.Sprintf("lock window of apply, %d step_tasks (statistics: %d)", size, est.Rows.StepTasks), Metrics: []Metric{
			{"forecast", fLock, "s"}, {"measured", window.Seconds(), "s"}, {"forecast/measured", fLock / window.Seconds(), "x"},
		}})

		// apply --online, stopped at 3x its forecast (past the 2x target
		// there is nothing more to learn, and a slow backfill can take hours).
		fOnline := float64(*est.OnlineTotalMS) / 1000
		limit := max(3*time.Duration(*est.OnlineTotalMS)*time.Millisecond, 2*time.Minute)
		stopped := false
		err = onClone(ctx, env, size, func(conn *pgx.Conn) error {
			octx, cancel := context.WithTimeout(ctx, limit)
			defer cancel()
			t := time.Now()
			rep, err := online.Upgrade(octx, conn, online.Options{})
			onlineTook = time.Since(t)
			if octx.Err() != nil && ctx.Err() == nil {
				stopped = true
				env.Logf("bench: forecast at %d: apply --online stopped after %s (forecast %.1fs): %v", size, onlineTook.Round(time.Second), fOnline, err)
				return nil
			}
			if err != nil {
				return err
			}
			if err := rep.Want(outcome.Applied); err != nil {
				return err
			}
			env.Logf("bench: forecast at %d: apply --online %s, phases %+v, backfill %+v", size, onlineTook.Round(time.Millisecond), rep.Report.Phases, rep.Report.Backfill)
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("forecast, apply --online at %d rows: %w", size, err)
		}
		measuredName, ratioName := "measured", "forecast/measured"
		if stopped {
			measuredName, ratioName = "measured more than (stopped at 3x the forecast)", "forecast/measured below"
		}
		rows = append(rows, Row{Benchmark: "forecast", Case: fmt.Sprintf("apply --online total, %d step_tasks", size), Metrics: []Metric{
			{"forecast", fOnline, "s"}, {measuredName, onlineTook.Seconds(), "s"}, {ratioName, fOnline / onlineTook.Seconds(), "x"},
		}})
	}
	return rows, nil
}

// onClone runs fn on a fresh copy of the generated database of size rows.
func onClone(ctx context.Context, env *Env, size int64, fn func(conn *pgx.Conn) error) error {
	dsn, drop, err := env.Clone(ctx, size)
	if err != nil {
		return err
	}
	defer drop()
	conn, err := session.Open(ctx, dsn, session.Rehearsal)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}
