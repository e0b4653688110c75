package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Env is what a benchmark gets: a server, the sizes to measure, and cheap
// clones of generated databases.
type Env struct {
	Server *pgprovider.Server
	Sizes  []int64
	Repeat int // measurements per case; the median is reported
	Logf   func(format string, args ...any)

	templates map[int64]string
}

// Metric is one measured value.
type Metric struct {
	Name  string
	Value float64
	Unit  string
}

// Row is one line of the results table.
type Row struct {
	Benchmark string
	Case      string
	Metrics   []Metric
}

// Benchmark is one named measurement.
type Benchmark struct {
	Name string
	Goal string
	Run  func(ctx context.Context, env *Env) ([]Row, error)
}

var registry = map[string]Benchmark{}

// Register adds a benchmark (from an init function).
func Register(b Benchmark) { registry[b.Name] = b }

// Names lists the registered benchmarks.
func Names() []string {
	var out []string
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Clone returns a fresh database holding the generated data of size rows,
// generated once per size and then copied file by file (STRATEGY FILE_COPY:
// a checkpoint and a directory copy, much cheaper than WAL-logging gigabytes).
func (e *Env) Clone(ctx context.Context, size int64) (dsn string, drop func(), err error) {
	tpl, err := e.template(ctx, size)
	if err != nil {
		return "", nil, err
	}
	return e.clone(ctx, tpl)
}

// CloneBaseline returns a fresh empty real pgflow 0.16.0 baseline database.
func (e *Env) CloneBaseline(ctx context.Context) (string, func(), error) { return e.Clone(ctx, 0) }

func (e *Env) clone(ctx context.Context, tpl string) (string, func(), error) {
	name := pgprovider.RandomName("pgflow_bench")
	if err := e.admin(ctx, "create database "+pgx.Identifier{name}.Sanitize()+" template "+pgx.Identifier{tpl}.Sanitize()+" strategy file_copy"); err != nil {
		return "", nil, err
	}
	drop := func() { _ = e.Server.DropDatabase(context.Background(), name) }
	return e.Server.DSNFor(name), drop, nil
}

func (e *Env) admin(ctx context.Context, sql string) error {
	conn, err := session.Open(ctx, e.Server.AdminDSN(), session.Admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func (e *Env) template(ctx context.Context, size int64) (string, error) {
	if e.templates == nil {
		e.templates = map[int64]string{}
	}
	if tpl, ok := e.templates[size]; ok {
		return tpl, nil
	}
	name, took, err := datagen.Template(ctx, e.Server, fmt.Sprintf("pgflow_bench_tpl_%d", size), size)
	if err != nil {
		return "", err
	}
	if size > 0 {
		e.Logf("bench: generated %d step_tasks rows in %s", size, took.Round(time.Second))
	}
	e.templates[size] = name
	return name, nil
}

// Close drops the templates.
func (e *Env) Close() {
	for _, tpl := range e.templates {
		_ = e.Server.DropTemplate(context.Background(), tpl)
	}
}

// Median of durations.
func Median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// Run runs the named benchmarks (all when names is empty) and writes a
// Markdown table to out.
func Run(ctx context.Context, env *Env, names []string, out io.Writer) error {
	if len(names) == 0 {
		names = Names()
	}
	fmt.Fprintf(out, "PostgreSQL %s (%s), %s, repeat %d (median reported)\n\n", env.Server.Version, env.Server.Kind, time.Now().UTC().Format(time.RFC3339), env.Repeat)
	for _, n := range names {
		b, ok := registry[n]
		if !ok {
			return fmt.Errorf("unknown benchmark %q (known: %s)", n, strings.Join(Names(), ", "))
		}
		env.Logf("bench: running %s", n)
		rows, err := b.Run(ctx, env)
		if err != nil {
			return fmt.Errorf("benchmark %s: %w", n, err)
		}
		fmt.Fprintf(out, "### %s\n\nGoal: %s\n\n| case | metrics |\n|---|---|\n", n, b.Goal)
		for _, r := range rows {
			var ms []string
			for _, m := range r.Metrics {
				ms = append(ms, fmt.Sprintf("%s %.3g %s", m.Name, m.Value, m.Unit))
			}
			fmt.Fprintf(out, "| %s | %s |\n", r.Case, strings.Join(ms, "; "))
		}
		fmt.Fprintln(out)
	}
	return nil
}
