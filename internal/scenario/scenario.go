// Package scenario holds the upgrade scenarios and their runner:
// each scenario is a pgflow 0.16.0 state plus expectations, run on its own
// throwaway database cloned from a baseline template, and reports what it
// proved and how long it took. `pgflow-upgrade fixtures replay` and the
// upgrade_tests package run the same scenarios.
package scenario

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Scenario is one named proof.
type Scenario struct {
	Name   string
	Proves string
	// Run builds its state in databases from env.NewDB, upgrades and checks.
	// A nil error means every expectation held.
	Run func(ctx context.Context, env *Env) error
}

// Result is the outcome of one scenario.
type Result struct {
	Name     string        `json:"name"`
	Proves   string        `json:"proves"`
	Passed   bool          `json:"passed"`
	Error    string        `json:"error,omitempty"`
	Duration time.Duration `json:"-"`
	Seconds  float64       `json:"seconds"`
	// Notes are measurements a scenario reports (e.g. the longest lock wait).
	Notes []string `json:"notes,omitempty"`
	// Metrics are the timed figures a scenario measured, with their budget.
	Metrics []Metric `json:"metrics,omitempty"`
}

// Metric is one measured duration and the budget it is held to.
type Metric struct {
	Name       string  `json:"name"` // lock_window, online_longest_wait, ...
	MS         float64 `json:"ms"`
	BudgetMS   float64 `json:"budget_ms,omitempty"` // 0: no budget
	OverBudget bool    `json:"over_budget,omitempty"`
}

// DB is a throwaway database of one scenario.
type DB struct {
	Name string
	DSN  string
	Pool *pgxpool.Pool
}

// Env is what a scenario runs in.
type Env struct {
	Server *pgprovider.Server
	// Upgrade is the upgrade under test (Runner.Upgrade, default Apply).
	Upgrade  UpgradeFunc
	template string
	logf     func(string, ...any)

	mu      sync.Mutex
	dbs     []*DB
	notes   []string
	metrics []Metric
}

// NewDB returns a fresh database cloned from the baseline template (the
// 0.16.0 engine on pgmq, or a captured state). It is dropped after the
// scenario.
func (e *Env) NewDB(ctx context.Context) (*DB, error) { return e.newDB(ctx, e.template) }

func (e *Env) newDB(ctx context.Context, template string) (*DB, error) {
	name := pgprovider.RandomName("pgflow_upgrade_replay")
	db := &DB{Name: name, DSN: e.Server.DSNFor(name)}
	// Recorded before CREATE DATABASE: a create cancelled by Ctrl-C can still
	// complete on the server, and cleanup drops with IF EXISTS.
	e.mu.Lock()
	e.dbs = append(e.dbs, db)
	e.mu.Unlock()
	if err := e.Server.CreateDatabase(ctx, name, template); err != nil {
		return nil, err
	}
	// The replay's own pool generates, loads and compares the rows: the
	// administrator's session, not pinned.
	var err error
	if db.Pool, err = session.OpenPool(ctx, db.DSN, session.Options{Purpose: session.Admin, Name: "pgflow-upgrade replay", MaxConns: 16}); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", name, err)
	}
	return db, nil
}

// Notef records a measurement shown with the scenario's result.
func (e *Env) Notef(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// Measure records a measured duration (reported with the result, and as a
// note) and returns an error when budget is positive and d exceeds it.
func (e *Env) Measure(name string, d, budget time.Duration) error {
	m := Metric{Name: name, MS: ms(d)}
	note := fmt.Sprintf("%s %s", name, d.Round(time.Millisecond))
	if budget > 0 {
		m.BudgetMS = ms(budget)
		m.OverBudget = d > budget
		note += fmt.Sprintf(" (budget %s)", budget)
	}
	e.mu.Lock()
	e.metrics = append(e.metrics, m)
	e.notes = append(e.notes, note)
	e.mu.Unlock()
	if m.OverBudget {
		return fmt.Errorf("%s %s exceeds the budget %s", name, d.Round(time.Millisecond), budget)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// Logf logs a progress line (stderr of replay, t.Log in tests).
func (e *Env) Logf(format string, args ...any) {
	if e.logf != nil {
		e.logf(format, args...)
	}
}

// NewEmptyDB returns a fresh empty database (for states that install the
// engine themselves, like fixtures' inflight). Dropped after the scenario.
func (e *Env) NewEmptyDB(ctx context.Context) (*DB, error) { return e.newDB(ctx, "") }

func (e *Env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, db := range e.dbs {
		if db.Pool != nil {
			db.Pool.Close()
		}
		if err := e.Server.DropDatabase(ctx, db.Name); err != nil {
			e.Logf("replay: %v", err)
		}
	}
	e.dbs = nil
}

// Runner runs scenarios on one server, each on fresh databases cloned from
// one template built once.
type Runner struct {
	Server *pgprovider.Server
	// Baseline fills the template database; nil installs the 0.16.0 engine
	// (fixtures.InstallEngine). A capture replay restores the file here.
	Baseline func(ctx context.Context, conn *pgx.Conn) error
	// Upgrade is the upgrade the scenarios run; nil means Apply. Tests put a
	// deliberately broken one here to see the scenarios catch it.
	Upgrade UpgradeFunc
	// Parallel is how many scenarios run at once (default 4).
	Parallel int
	Logf     func(string, ...any)

	once     sync.Once
	template string
	tplErr   error
}

// Template builds (once) and returns the template database's name.
func (r *Runner) Template(ctx context.Context) (string, error) {
	r.once.Do(func() {
		name := pgprovider.RandomName("pgflow_upgrade_replay_tpl")
		if err := r.Server.CreateDatabase(ctx, name, ""); err != nil {
			r.tplErr = err
			return
		}
		if err := r.fill(ctx, name); err != nil {
			_ = r.Server.DropDatabase(context.WithoutCancel(ctx), name)
			r.tplErr = fmt.Errorf("building the baseline template: %w", err)
			return
		}
		if err := r.Server.MarkTemplate(ctx, name); err != nil {
			_ = r.Server.DropDatabase(context.WithoutCancel(ctx), name)
			r.tplErr = err
			return
		}
		r.template = name
	})
	return r.template, r.tplErr
}

func (r *Runner) fill(ctx context.Context, name string) error {
	conn, err := session.Open(ctx, r.Server.DSNFor(name), session.Admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if r.Baseline != nil {
		return r.Baseline(ctx, conn)
	}
	kind, err := fixtures.InstallEngine(ctx, conn)
	if err != nil {
		return err
	}
	r.logf("replay: baseline template %s: pgflow 0.16.0 on pgmq %s", name, kind)
	return nil
}

// Close drops the template.
func (r *Runner) Close() error {
	if r.template == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.Server.DropTemplate(ctx, r.template)
	r.template = ""
	return err
}

func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// RunOne runs one scenario and returns its result; a panic is a failure.
func (r *Runner) RunOne(ctx context.Context, s Scenario) (res Result) {
	res = Result{Name: s.Name, Proves: s.Proves}
	start := time.Now()
	defer func() {
		res.Duration = time.Since(start)
		res.Seconds = float64(res.Duration.Milliseconds()) / 1000
	}()
	tpl, err := r.Template(ctx)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	env := &Env{Server: r.Server, Upgrade: r.Upgrade, template: tpl, logf: r.Logf}
	if env.Upgrade == nil {
		env.Upgrade = Apply
	}
	defer env.cleanup()
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
			}
		}()
		err = s.Run(ctx, env)
	}()
	res.Notes = env.notes
	res.Metrics = env.metrics
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.Passed = true
	return res
}

// Run runs scenarios (Parallel at a time) and returns their results in the
// order given.
func (r *Runner) Run(ctx context.Context, scenarios []Scenario) []Result {
	par := r.Parallel
	if par <= 0 {
		par = 4
	}
	out := make([]Result, len(scenarios))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, s := range scenarios {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = r.RunOne(ctx, s)
			status := "PASS"
			if !out[i].Passed {
				status = "FAIL"
			}
			r.logf("replay: %s %s (%.1fs)", status, s.Name, out[i].Seconds)
		}()
	}
	wg.Wait()
	return out
}

// Select returns the named scenarios of all, in the order named; no names
// means all of them.
func Select(all []Scenario, names []string) ([]Scenario, error) {
	if len(names) == 0 {
		return all, nil
	}
	byName := map[string]Scenario{}
	var known []string
	for _, s := range all {
		byName[s.Name] = s
		known = append(known, s.Name)
	}
	sort.Strings(known)
	var out []Scenario
	for _, n := range names {
		s, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q (known: %s)", n, strings.Join(known, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

// Failed counts the results that did not pass.
func Failed(results []Result) int {
	n := 0
	for _, r := range results {
		if !r.Passed {
			n++
		}
	}
	return n
}

// errorf builds an expectation failure.
func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
