package upgrade_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// envHopRows sets the size of TestLongHopLocksAtScale: runs, step_states and
// step_tasks rows each (BENCHMARKS.md's figures: 1000000).
const envHopRows = "PGFLOW_UPGRADE_HOP_ROWS"

// TestLongHopLocksAtScale measures 0.14.1 -> newest side by side on the
// same data: upstream's own files run in order (each in its own
// transaction, its locks held until its commit), apply (one transaction
// after building the blocking statements beforehand) and apply --online.
// It logs the table BENCHMARKS.md shows and checks that neither of the
// tool's paths holds its locks longer than upstream's longest file.
func TestLongHopLocksAtScale(t *testing.T) {
	testdb.SkipUnlessLong(t, "0.14.1 -> newest at scale: upstream's files vs apply vs apply --online")
	rows := 20000
	if v := os.Getenv(envHopRows); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive row count", envHopRows, v)
		}
		rows = n
	}
	t.Logf("components: %s; %d runs, step_states and step_tasks", testdb.UpstreamComponents(), rows)
	ctx := context.Background()
	base := testdb.Upstream(t, "0.14.1")
	gen := time.Now()
	for _, s := range []string{
		`select pgflow.create_flow('bench'); select pgflow.add_step('bench', 's1')`,
		`insert into pgflow.runs (run_id, flow_slug, status, input, output, remaining_steps, started_at, completed_at)
		 select md5(i::text)::uuid, 'bench', 'completed', '{}', '{}', 0, now() - interval '1 day', now() from generate_series(1, $1::int) i`,
		`insert into pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, remaining_deps, created_at, started_at, completed_at, initial_tasks, output)
		 select 'bench', md5(i::text)::uuid, 's1', 'completed', 0, 0, now() - interval '1 day', now() - interval '1 day', now(), 1, '{}' from generate_series(1, $1::int) i`,
		`insert into pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, task_index, status, attempts_count, output, queued_at, started_at, completed_at)
		 select 'bench', md5(i::text)::uuid, 's1', i, 0, 'completed', 1, '{}', now() - interval '1 day', now() - interval '1 day', now() from generate_series(1, $1::int) i`,
	} {
		var args []any
		if strings.Contains(s, "$1") {
			args = append(args, rows)
		}
		if _, err := base.Pool.Exec(ctx, s, args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := base.Pool.Exec(ctx, `analyze`); err != nil {
		t.Fatal(err)
	}
	t.Logf("generated in %s", time.Since(gen).Round(time.Millisecond))

	// Upstream's own files, in order: each file's transaction holds its
	// locks until it commits.
	theirs := base.Clone(t)
	took := theirs.PushUpstream(t, 20, 27)
	var longest time.Duration
	var lines []string
	for i, d := range took {
		f := versions.UpstreamFiles()[20+i]
		lines = append(lines, fmt.Sprintf("| upstream file %d `%s` | %s |", f.Index, f.Title(), d.Round(time.Millisecond)))
		longest = max(longest, d)
	}

	// apply: the blocking statements built beforehand, then one transaction.
	ours := base.Clone(t)
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	res, err := upgrade.Apply(ctx, testdb.Connect(t, ours.DSN), opts)
	if err != nil || res.Report.VersionNow != versions.Newest {
		t.Fatalf("apply: %v (%s)", err, res.Message)
	}
	var pre time.Duration
	for _, s := range res.Report.Steps {
		if s.Step == upgrade.StepPrebuild {
			pre += time.Duration(s.DurationMS) * time.Millisecond
		}
	}
	window := time.Duration(res.Report.LockWindowMS) * time.Millisecond
	lines = append(lines,
		fmt.Sprintf("| apply: built beforehand (CONCURRENTLY, VALIDATE: reads and writes go on) | %s |", pre.Round(time.Millisecond)),
		fmt.Sprintf("| apply: the one transaction's lock window (all hops) | %s |", window),
		fmt.Sprintf("| apply: total | %s |", time.Duration(res.Report.TotalMS)*time.Millisecond))

	// apply --online.
	onl := base.Clone(t)
	ores, err := online.Upgrade(ctx, testdb.Connect(t, onl.DSN), online.Options{Switch: upgrade.Options{PgflowMigrations: opts.PgflowMigrations}})
	if err != nil || ores.Report.Switch == nil || ores.Report.Switch.Report.VersionNow != versions.Newest {
		t.Fatalf("apply --online: %v (%s)", err, ores.Message)
	}
	var olines []string
	for _, l := range ores.Report.Locks {
		olines = append(olines, fmt.Sprintf("%s %d ms", l.Step, l.WindowMS))
	}
	lines = append(lines,
		fmt.Sprintf("| apply --online: longest lock window (%s) | %d ms |", strings.Join(olines, ", "), ores.Report.LongestLockWindowMS),
		fmt.Sprintf("| apply --online: total | %s |", time.Duration(ores.Report.TotalMS)*time.Millisecond))
	// Where the lock windows go: the steps and statements of the catch-up
	// and of the switch.
	if ores.Report.CatchUp != nil {
		t.Logf("apply --online's catch-up to 0.16.0:\n%s", stepLines(ores.Report.CatchUp.Report))
	}
	t.Logf("apply --online's switch:\n%s", stepLines(ores.Report.Switch.Report))
	t.Logf("0.14.1 -> %s at %d rows (longest upstream file %s):\n%s", versions.Newest, rows, longest.Round(time.Millisecond), strings.Join(lines, "\n"))
	// A measurement, not a timed assertion: how the windows compare depends
	// on the machine and its load; make bench and BENCHMARKS.md compare them.
	t.Logf("apply's lock window %s against upstream's longest file %s (ratio %.2f)", window, longest, float64(window)/float64(longest))
}

// stepLines lists a run's timed steps and statements (those of 1 ms or
// more), and what the statements run under the table locks took together:
// the DDL's own time in the window, its floor in this run.
func stepLines(r *upgrade.Report) string {
	var under time.Duration
	var n int
	for _, st := range r.Statements {
		if st.Migration != "prebuild" && !strings.HasPrefix(st.Summary, "before the table locks: ") {
			under += time.Duration(st.DurationUS) * time.Microsecond
			n++
		}
	}
	parts := []string{fmt.Sprintf("lock window %d ms; its %d statements under the locks took %s together",
		r.LockWindowMS, n, under.Round(100*time.Microsecond))}
	for _, st := range r.Steps {
		if st.DurationMS > 0 {
			parts = append(parts, fmt.Sprintf("step %s %s: %d ms", st.Step, st.Detail, st.DurationMS))
		}
	}
	for _, st := range r.Statements {
		if st.DurationMS > 0 {
			parts = append(parts, fmt.Sprintf("statement %s #%d %s: %d ms", st.Migration, st.Index, st.Summary, st.DurationMS))
		}
	}
	return strings.Join(parts, "\n")
}
