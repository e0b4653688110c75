package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/waitprobe"
)

// online: apply --online against the transactional apply, with a probe.
func init() {
	Register(Benchmark{
		Name: "online",
		Goal: "apply --online (real 0.16.0 -> 0.17.0): longest wait of a probe (lock_timeout-bounded SELECT and UPDATE on step_tasks every 10 ms) under 50 ms at 5M rows; total time at most 1.1x the floor (ctid-range batches of 10k rows, CREATE UNIQUE INDEX CONCURRENTLY x3, CHECK NOT VALID + VALIDATE + SET NOT NULL, on a fresh copy in the same run); the transactional apply for reference",
		Run:  benchOnline,
	})
}

// measured runs fn on a fresh clone of the real pgflow 0.16.0 with size
// generated step_tasks rows, the probe running throughout.
func measured(ctx context.Context, env *Env, size int64, fn func(ctx context.Context, conn *pgx.Conn) error) (took time.Duration, p waitprobe.Result, err error) {
	return measuredWith(ctx, env, size, &waitprobe.Probe{}, fn)
}

// measuredWith is measured with a probe of the caller's.
func measuredWith(ctx context.Context, env *Env, size int64, p *waitprobe.Probe, fn func(ctx context.Context, conn *pgx.Conn) error) (took time.Duration, _ waitprobe.Result, err error) {
	dsn, drop, err := env.Clone(ctx, size)
	if err != nil {
		return 0, waitprobe.Result{}, err
	}
	defer drop()
	conn, err := session.Open(ctx, dsn, session.Rehearsal)
	if err != nil {
		return 0, waitprobe.Result{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	perr := make(chan error, 1)
	ready := make(chan struct{})
	go func() { perr <- p.Run(pctx, dsn, ready) }()
	select { // the probe is connected and has made its first round
	case <-ready:
	case err := <-perr:
		return 0, waitprobe.Result{}, fmt.Errorf("the wait probe did not start: %w", err)
	}
	start := time.Now()
	err = fn(ctx, conn)
	took = time.Since(start)
	stop()
	if e := <-perr; e != nil && err == nil {
		err = e
	}
	return took, p.Result(), err
}

func benchOnline(ctx context.Context, env *Env) ([]Row, error) {
	var rows []Row
	for _, size := range env.Sizes {
		var onTotal, onProbe, onWindow, txTotal, txProbe, flTotal, flProbe []time.Duration
		var onFails, txFails, flFails int
		for i := 0; i < env.Repeat; i++ {
			var rep *outcome.Result[*online.Report]
			took, p, err := measured(ctx, env, size, func(ctx context.Context, conn *pgx.Conn) error {
				var err error
				if rep, err = online.Upgrade(ctx, conn, online.Options{}); err != nil {
					return err
				}
				return rep.Want(outcome.Applied)
			})
			if err != nil {
				return nil, fmt.Errorf("apply --online at %d rows: %w", size, err)
			}
			env.Logf("bench: online at %d: %s, phases %+v, locks %+v, backfill %+v, probe longest %s over %d ops (%d failed %v)",
				size, took.Round(time.Millisecond), rep.Report.Phases, rep.Report.Locks, rep.Report.Backfill, p.Longest, p.Statements, p.Failures, p.Errors)
			logSwitch(env, rep.Report.Switch)
			onTotal, onProbe = append(onTotal, took), append(onProbe, p.Longest)
			onWindow = append(onWindow, time.Duration(rep.Report.LongestLockWindowMS)*time.Millisecond)
			onFails += p.Failures

			var fsteps map[string]time.Duration
			// The floor's probe only reads: an UPDATE of an unfilled row may
			// put its new version (queue_name NULL) behind the floor's cursor,
			// which has no trigger to fill it (apply --online's has), and the
			// floor would then need a scan for NULLs it is measured without.
			took, p, err = measuredWith(ctx, env, size, &waitprobe.Probe{ReadOnly: true}, func(ctx context.Context, conn *pgx.Conn) error {
				var err error
				fsteps, err = floor(ctx, conn)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("floor at %d rows: %w", size, err)
			}
			env.Logf("bench: floor at %d: %s (%v), probe longest %s over %d ops", size, took.Round(time.Millisecond), fsteps, p.Longest, p.Statements)
			flTotal, flProbe = append(flTotal, took), append(flProbe, p.Longest)
			flFails += p.Failures

			took, p, err = measured(ctx, env, size, func(ctx context.Context, conn *pgx.Conn) error {
				rep, err := upgrade.Apply(ctx, conn, upgrade.Options{LockRetries: 50})
				if err != nil {
					return err
				}
				return rep.Want(outcome.Applied)
			})
			if err != nil {
				return nil, fmt.Errorf("transactional apply at %d rows: %w", size, err)
			}
			env.Logf("bench: transactional at %d: %s, probe longest %s over %d ops", size, took.Round(time.Millisecond), p.Longest, p.Statements)
			txTotal, txProbe = append(txTotal, took), append(txProbe, p.Longest)
			txFails += p.Failures
		}
		on, tx, fl := Median(onTotal), Median(txTotal), Median(flTotal)
		rows = append(rows,
			Row{Benchmark: "online", Case: fmt.Sprintf("apply --online, %d step_tasks", size), Metrics: []Metric{
				{"probe longest wait", float64(Median(onProbe).Microseconds()) / 1000, "ms"},
				{"longest lock window", float64(Median(onWindow).Microseconds()) / 1000, "ms"},
				{"total", on.Seconds(), "s"},
				{"vs floor", on.Seconds() / fl.Seconds(), "x"},
				{"vs transactional", on.Seconds() / tx.Seconds(), "x"},
				{"probe errors", float64(onFails), ""},
			}},
			Row{Benchmark: "online", Case: fmt.Sprintf("floor (ctid batches, indexes concurrently, checks), %d step_tasks", size), Metrics: []Metric{
				{"probe (SELECT only) longest wait", float64(Median(flProbe).Microseconds()) / 1000, "ms"},
				{"total", fl.Seconds(), "s"},
				{"probe errors", float64(flFails), ""},
			}},
			Row{Benchmark: "online", Case: fmt.Sprintf("transactional apply, %d step_tasks", size), Metrics: []Metric{
				{"probe longest wait", float64(Median(txProbe).Microseconds()) / 1000, "ms"},
				{"total", tx.Seconds(), "s"},
				{"probe errors", float64(txFails), ""},
			}})
	}
	return rows, nil
}

// logSwitch logs where the switch transaction spent its time: its steps and
// its slowest statements (the lock window is from the table locks to commit).
func logSwitch(env *Env, res *outcome.Result[*upgrade.Report]) {
	if res == nil {
		return
	}
	sw := res.Report
	var steps []string
	for _, st := range sw.Steps {
		steps = append(steps, fmt.Sprintf("%s %dms", st.Step, st.DurationMS))
	}
	stmts := append([]upgrade.StatementReport(nil), sw.Statements...)
	sort.Slice(stmts, func(i, j int) bool { return stmts[i].DurationUS > stmts[j].DurationUS })
	var slow []string
	var total int64
	for _, st := range sw.Statements {
		total += st.DurationUS
	}
	for _, st := range stmts[:min(8, len(stmts))] {
		sum := st.Summary
		if len(sum) > 60 {
			sum = sum[:60]
		}
		slow = append(slow, fmt.Sprintf("#%d %dus %s", st.Index, st.DurationUS, sum))
	}
	var checks []string
	for _, c := range sw.Preflight {
		checks = append(checks, fmt.Sprintf("%s %dms", c.ID, c.DurationMS))
	}
	env.Logf("bench: switch window %dms; steps: %s; preflight: %s; %d statements, %dus in all; slowest: %s",
		sw.LockWindowMS, strings.Join(steps, ", "), strings.Join(checks, ", "), len(sw.Statements), total, strings.Join(slow, " | "))
}
