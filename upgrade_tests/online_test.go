package upgrade_tests

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

var onlineSeeds = flag.Int("online-seeds", 20, "how many seeded interrupted online upgrades TestOnlineInterrupted runs (1 with -short unless given)")

// onlineOptions: small batches, so a small state takes many batches (many
// points to be interrupted at).
func onlineOptions() online.Options {
	o := online.Options{BatchSize: 5, Wait: 10 * time.Second}
	if *noIntegrity {
		o.Switch.Verify = func() error { return nil }
	}
	return o
}

// onlineUpgrade is `apply --online` as a scenario.UpgradeFunc: the report
// is the switch's (the transactional apply the online path ends with), with
// the preflight results and blockers of the whole run (the warnings come
// from the first preflight: the switch runs only blockers under its locks;
// duplicates are found by the index build, before any switch).
func onlineUpgrade(ctx context.Context, db *scenario.DB) (*outcome.Result[*upgrade.Report], error) {
	conn, err := session.Open(ctx, db.DSN, session.Test)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rep, err := online.Upgrade(ctx, conn, onlineOptions())
	sw := &outcome.Result[*upgrade.Report]{Outcome: rep.Outcome, Message: rep.Message, Report: &upgrade.Report{}}
	if rep.Report.Switch != nil {
		c, r := *rep.Report.Switch, *rep.Report.Switch.Report
		c.Report = &r
		sw = &c
	}
	sw.Report.Preflight, sw.Report.Blockers = rep.Report.Preflight, rep.Report.Blockers
	if err != nil {
		return sw, fmt.Errorf("apply --online (%s): %w", rep.Outcome, err)
	}
	if rep.Outcome != outcome.Applied {
		return sw, fmt.Errorf("apply --online: outcome %s: %s", rep.Outcome, rep.Message)
	}
	return sw, nil
}

// TestScenariosOnline runs every built-in scenario (the state-survival
// fingerprints, the old workers, traffic, the malformed states that must be
// refused with the database unchanged) with apply --online.
func TestScenariosOnline(t *testing.T) {
	testdb.SkipIfShort(t, "runs every built-in scenario (the state-survival fingerprints, the old workers,...")
	// The same runner as TestScenarios: the scenarios' states move to the
	// real 0.16.0 baseline with the scenario package, for both paths at once.
	r := &scenario.Runner{Server: testdb.Server(t), Upgrade: onlineUpgrade, Logf: func(string, ...any) {}}
	t.Cleanup(func() { _ = r.Close() })
	for _, s := range scenario.Builtin() {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			res := r.RunOne(context.Background(), s)
			for _, n := range res.Notes {
				t.Log(n)
			}
			if !res.Passed {
				t.Fatalf("scenario %s with --online (proves: %s) failed:\n%s", s.Name, s.Proves, res.Error)
			}
		})
	}
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// The flow the application traffic runs during the online upgrade.
const trafficFlow = "zz_online_traffic"

var trafficDef = oldworker.Flow{
	Slug:    trafficFlow,
	Options: oldworker.Options{MaxAttempts: oldworker.Int(3), BaseDelay: oldworker.Int(0), Timeout: oldworker.Int(5)},
	Steps:   []oldworker.Step{{Slug: "a"}, {Slug: "b", DependsOn: []string{"a"}}},
}

// appTraffic is the application during the online upgrade: start_flow in a
// loop, and a 0.16.0 worker completing the tasks until the fence stops it.
type appTraffic struct {
	started, completed atomic.Int64
	fenced             atomic.Bool
	rowtype            atomic.Int64 // calls that straddled the expand (42804)
	errs               []error
	mu                 sync.Mutex
}

func (a *appTraffic) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

func startTraffic(ctx context.Context, pool *pgxpool.Pool) (*appTraffic, func() error, error) {
	a := &appTraffic{}
	w := oldworker.New(pool, oldworker.Config{
		FlowSlug: trafficFlow, Shape: trafficDef.MustShape(), FunctionName: trafficFlow + "-fn",
		Handlers: map[string]oldworker.Handler{
			"a": func(ctx context.Context, t oldworker.Task) (any, error) {
				a.completed.Add(1)
				return map[string]int{"n": 1}, nil
			},
			"b": func(ctx context.Context, t oldworker.Task) (any, error) { a.completed.Add(1); return 2, nil },
		},
		BatchSize: 5, VisibilityTimeout: 2, MaxPollSeconds: 1, PollIntervalMs: 20, Logger: quietLogger,
	})
	if err := w.Start(ctx); err != nil {
		return nil, nil, fmt.Errorf("starting the 0.16.0 traffic worker: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var err error
		for {
			err = w.Run(ctx)
			// 42804: a complete_task in flight at the instant the expand
			// commits (its statement began with the old step_tasks row
			// type); see docs/online.md. The task stays started and is
			// claimed again after its vt: nothing is lost. The worker goes on.
			if err != nil && strings.Contains(err.Error(), "42804") && ctx.Err() == nil {
				a.rowtype.Add(1)
				continue
			}
			break
		}
		switch {
		case ctx.Err() != nil:
		case err != nil && strings.Contains(err.Error(), "42883"):
			a.fenced.Store(true) // the fence: start_tasks is gone
		case err != nil:
			a.fail(fmt.Errorf("0.16.0 traffic worker: %w", err))
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			// A bounded wait, as an application would have.
			_, err := pool.Exec(ctx, `select pgflow.start_flow($1, '{"x": 1}'::jsonb)`, trafficFlow)
			if err == nil {
				a.started.Add(1)
			} else if ctx.Err() == nil {
				a.fail(fmt.Errorf("start_flow during the online upgrade: %w", err))
			}
			// 50 runs a second: every phase still meets traffic, and the
			// tables the backfill walks do not grow faster than a test needs.
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	stop := func() error {
		cancel()
		wg.Wait()
		a.mu.Lock()
		defer a.mu.Unlock()
		return errors.Join(a.errs...)
	}
	return a, stop, nil
}

// withoutTraffic drops the traffic flow's rows, queue and worker from a
// fingerprint: they change by design while the upgrade runs.
func withoutTraffic(fp *fingerprint.Fingerprint) {
	slug := `"` + trafficFlow + `"`
	delete(fp.Tables, fingerprint.QueueTable(trafficFlow))
	delete(fp.Tables, fingerprint.ArchiveTable(trafficFlow))
	for _, t := range fp.Tables {
		for k, r := range t.Rows {
			if r["flow_slug"] == slug || r["queue_name"] == slug || r["function_name"] == `"`+trafficFlow+`-fn"` {
				delete(t.Rows, k)
			}
		}
	}
}

// TestOnlineInterrupted: seeded random real 0.16.0 states, upgraded online with
// application traffic running, killed at random points (the backend
// terminated, or the client's connection cut as when its process is killed)
// one to three times, then resumed: every pre-existing row and message is
// identical, every row (old and written by the traffic) has the right
// queue_name, verify passes, and nothing of the online upgrade is left.
func TestOnlineInterrupted(t *testing.T) {
	for s := 1; s <= seedCount("online-seeds", *onlineSeeds, 1); s++ {
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Parallel()
			if err := interruptedSeed(t, uint64(s)); err != nil {
				t.Fatalf("seed %d: %v\nrerun: go test ./upgrade_tests -run 'TestOnlineInterrupted/seed=%d$'", s, err, s)
			}
		})
	}
}

func interruptedSeed(t *testing.T, seed uint64) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x6f6e6c696e65))
	tdb := testdb.Baseline(t)
	db := &scenario.DB{Name: tdb.Name, DSN: tdb.DSN, Pool: tdb.Pool}
	if err := inflightState(ctx, db.Pool, rng); err != nil {
		return err
	}
	app, stopTraffic, err := startTraffic(ctx, db.Pool)
	if err != nil {
		return err
	}
	defer stopTraffic()
	before, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	withoutTraffic(before)

	kills := 1 + rng.IntN(3)
	var log []string
	var final *outcome.Result[*online.Report]
	for run := 0; ; run++ {
		if run > kills+5 {
			return fmt.Errorf("not upgraded after %d runs: %s", run, strings.Join(log, "; "))
		}
		conn, err := session.Open(ctx, db.DSN, session.Test)
		if err != nil {
			return err
		}
		opts := onlineOptions()
		if run < kills {
			// Half of the kills count only the online phases' points
			// (preflight, expand, batches, check, validate, index, switch),
			// the others also every statement of the switch transaction.
			target, mode, phasesOnly := rng.IntN(60), rng.IntN(2), rng.IntN(2) == 0
			if phasesOnly {
				target = rng.IntN(25)
			}
			delay := time.Duration(rng.IntN(15)) * time.Millisecond
			var n atomic.Int64
			var fired atomic.Bool
			kill := func(pid uint32, at string) {
				if n.Add(1)-1 != int64(target) || !fired.CompareAndSwap(false, true) {
					return
				}
				log = append(log, fmt.Sprintf("run %d: %s at point %d (%s) +%s", run, map[int]string{0: "terminate backend", 1: "cut connection"}[mode], target, at, delay))
				go func() {
					time.Sleep(delay)
					if mode == 0 {
						_, _ = db.Pool.Exec(context.Background(), `select pg_terminate_backend($1)`, pid)
					} else {
						_ = conn.PgConn().Conn().Close()
					}
				}()
			}
			opts.Hooks.At = func(ctx context.Context, pid uint32, point string) error { kill(pid, point); return nil }
			if !phasesOnly {
				opts.Switch.Hooks.BeforeStatement = func(ctx context.Context, pid uint32, m migrations.Migration, i int, _ string) error {
					kill(pid, fmt.Sprintf("switch statement %d", i))
					return nil
				}
			}
		}
		rep, err := online.Upgrade(ctx, conn, opts)
		conn.Close(context.WithoutCancel(ctx))
		if err == nil && (rep.Outcome == outcome.Applied || rep.Outcome == outcome.AlreadyApplied) {
			final = rep
			log = append(log, fmt.Sprintf("run %d: %s", run, rep.Outcome))
			break
		}
		if err == nil {
			return fmt.Errorf("run %d: outcome %s without an error: %s", run, rep.Outcome, rep.Message)
		}
		if run >= kills {
			return fmt.Errorf("run %d (no kill): %w; before: %s", run, err, strings.Join(log, "; "))
		}
		if rep.Outcome == outcome.Refused {
			return fmt.Errorf("run %d refused after a kill: %w", run, err)
		}
		log = append(log, fmt.Sprintf("run %d stopped: %.120s", run, err.Error()))
	}
	// Traffic goes on a little on the upgraded schema, then stops.
	time.Sleep(50 * time.Millisecond)
	if err := stopTraffic(); err != nil {
		return fmt.Errorf("application traffic failed during the online upgrade: %w (%s)", err, strings.Join(log, "; "))
	}
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	withoutTraffic(after)
	if d := fingerprint.Compare(before, after); len(d) > 0 {
		return fmt.Errorf("%d differences after the interrupted online upgrade (%s):\n%s", len(d), strings.Join(log, "; "), fingerprint.Format(d, 20))
	}
	want, err := upgrade.Want017()
	if err != nil {
		return err
	}
	got, err := catalog.Read(ctx, db.Pool, "pgflow")
	if err != nil {
		return err
	}
	got.PGMQ = want.PGMQ
	if d := catalog.Diff(want, got); len(d) > 0 {
		return fmt.Errorf("the catalog is not pgflow 0.17.0 after the online upgrade (%s):\n  %s", strings.Join(log, "; "), strings.Join(catalog.Strings(d), "\n  "))
	}
	if d, err := fingerprint.CheckNewColumns(ctx, db.Pool); err != nil || len(d) > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("queue_name wrong (%s):\n%s", strings.Join(log, "; "), fingerprint.Format(d, 20))
	}
	conn, err := session.Open(ctx, db.DSN, session.Test)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	v, err := upgrade.Verify(ctx, conn)
	if err != nil {
		return err
	}
	if !v.OK {
		return fmt.Errorf("verify failed: %+v", upgrade.Failed(v.Checks))
	}
	var left bool
	if err := db.Pool.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.online_progress') is not null
		or pg_catalog.to_regprocedure('pgflow_upgrade.online_fill_queue_name()') is not null`).Scan(&left); err != nil {
		return err
	}
	if left {
		return errors.New("the online bookkeeping (pgflow_upgrade.online_progress, its trigger function) was left behind")
	}
	if app.started.Load() == 0 {
		return errors.New("the application traffic started no run during the upgrade")
	}
	t.Logf("%s; traffic: %d runs started, %d tasks completed by the 0.16.0 worker (fenced: %v, %d calls in flight at the expand failed with 42804); backfill of the last run %+v",
		strings.Join(log, "; "), app.started.Load(), app.completed.Load(), app.fenced.Load(), app.rowtype.Load(), final.Report.Backfill)
	return nil
}
