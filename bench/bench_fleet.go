package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// fleetSizes are the fleets the benchmark audits: 100 for the goal, 20
// beside it to show that the fleet's memory does not grow with the number
// of targets (PGFLOW_UPGRADE_BENCH_FLEET, e.g. "10", overrides them).
var fleetSizes = []int{20, 100}

// `fleet audit --parallel 8` of 100 databases on one server against what a
// person would do without it: 100 `audit` commands one after another in a
// shell loop. Both run the built binary as a user would; the fleet's peak
// resident set (VmHWM) is read from the tool itself (PGFLOW_UPGRADE_PEAK_RSS).
func init() {
	Register(Benchmark{
		Name: "fleet-audit",
		Goal: "fleet audit --parallel 8 of 100 databases in at most 0.6x the wall time of 100 audit commands in a shell loop, memory bounded and written down",
		Run:  benchFleetAudit,
	})
}

func benchFleetAudit(ctx context.Context, env *Env) ([]Row, error) {
	sizes := fleetSizes
	if v := os.Getenv("PGFLOW_UPGRADE_BENCH_FLEET"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("PGFLOW_UPGRADE_BENCH_FLEET %q: want a positive number", v)
		}
		sizes = []int{n}
	}
	dir, err := os.MkdirTemp("", "pgflow-bench-fleet-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := buildTool(ctx, dir)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, n := range sizes {
		row, err := fleetAuditOf(ctx, env, bin, dir, n)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// fleetAuditOf measures one fleet of n fresh 0.16.0 databases.
func fleetAuditOf(ctx context.Context, env *Env, bin, dir string, n int) (Row, error) {
	targets := filepath.Join(dir, fmt.Sprintf("targets-%d.txt", n))
	var lines []string
	for i := range n {
		dsn, drop, err := env.CloneBaseline(ctx)
		if err != nil {
			return Row{}, err
		}
		defer drop()
		if err := fillFleetDB(ctx, dsn); err != nil {
			return Row{}, err
		}
		lines = append(lines, fmt.Sprintf("db-%03d %s", i+1, dsn))
	}
	if err := os.WriteFile(targets, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return Row{}, err
	}
	// The loop a person would write: one audit per line, output discarded.
	loop := `while read -r name dsn; do "$0" audit --dsn "$dsn" --format json >/dev/null; done < "$1"`
	var loopT, fleetT []time.Duration
	var fleetRSS, auditRSS float64
	for rep := 0; rep < env.Repeat; rep++ {
		start := time.Now()
		if out, err := exec.CommandContext(ctx, "sh", "-c", loop, bin, targets).CombinedOutput(); err != nil {
			return Row{}, fmt.Errorf("the audit loop: %v: %s", err, out)
		}
		loopT = append(loopT, time.Since(start))
		start = time.Now()
		rss, err := peakRSSRun(ctx, bin, "fleet", "audit", "--targets", targets, "--parallel", "8", "--format", "json")
		if err != nil {
			return Row{}, fmt.Errorf("fleet audit: %w", err)
		}
		fleetT = append(fleetT, time.Since(start))
		fleetRSS = max(fleetRSS, rss)
		_, dsn, _ := strings.Cut(lines[0], " ")
		if one, err := peakRSSRun(ctx, bin, "audit", "--dsn", dsn, "--format", "json"); err == nil {
			auditRSS = max(auditRSS, one)
		}
		env.Logf("bench: fleet-audit of %d, run %d: loop %s, fleet %s", n, rep+1, loopT[rep].Round(time.Millisecond), fleetT[rep].Round(time.Millisecond))
	}
	l, f := Median(loopT), Median(fleetT)
	return Row{Benchmark: "fleet-audit", Case: fmt.Sprintf("%d databases, 0.16.0 with one flow and one run each", n), Metrics: []Metric{
		{fmt.Sprintf("%d audits in a shell loop", n), l.Seconds(), "s"},
		{"fleet audit --parallel 8", f.Seconds(), "s"},
		{"ratio", f.Seconds() / l.Seconds(), "x"},
		{"fleet peak RSS", fleetRSS, "MiB"},
		{"one audit's peak RSS", auditRSS, "MiB"},
	}}, nil
}

// buildTool builds the pgflow-upgrade binary into dir.
func buildTool(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "pgflow-upgrade")
	// The go that runs this benchmark (go run) is on PATH or in Go's
	// usual place, as the Makefile finds it.
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "./cmd/pgflow-upgrade").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the tool (run from the repository's root): %v: %s", err, out)
	}
	return bin, nil
}

// fillFleetDB gives a fleet database one flow with one started run.
func fillFleetDB(ctx context.Context, dsn string) error {
	conn, err := session.Open(ctx, dsn, session.Admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range []string{`select pgflow.create_flow('greet')`, `select pgflow.add_step('greet', 'hello')`,
		`select pgflow.start_flow('greet', '{"name": "Ada"}'::jsonb)`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

var peakRSSLine = regexp.MustCompile(`peak RSS (\d+) kB`)

// peakRSSRun runs the tool and returns its peak resident set in MiB, as
// it reports it itself. Any exit code is fine: the audits' verdicts are
// not what is measured.
func peakRSSRun(ctx context.Context, bin string, args ...string) (float64, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PGFLOW_UPGRADE_PEAK_RSS=1")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	_ = cmd.Run()
	m := peakRSSLine.FindStringSubmatch(errOut.String())
	if m == nil {
		return 0, fmt.Errorf("no peak RSS reported: %s", errOut.String())
	}
	kb, _ := strconv.ParseFloat(m[1], 64)
	return kb / 1024, nil
}
