package bench

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
)

// The two references `apply` is measured against, each run by psql in one
// transaction, so the whole run is the ACCESS EXCLUSIVE window: 0.17.0's new
// columns (flows.queue_mode; steps and step_tasks queue_name =
// lower(flow_slug)) without its indexes, checks or functions, the floor of
// the data work.
var applyReferences = []struct{ name, sql string }{
	{"reference: UPDATE backfill in one transaction", `
begin;
alter table pgflow.flows add column queue_mode text not null default 'flow';
alter table pgflow.steps add column queue_name text;
update pgflow.steps set queue_name = lower(flow_slug);
alter table pgflow.steps alter column queue_name set not null;
alter table pgflow.step_tasks add column queue_name text;
update pgflow.step_tasks set queue_name = lower(flow_slug);
alter table pgflow.step_tasks alter column queue_name set not null;
commit;`},
	{"reference: one-pass rewrite (ALTER .. TYPE .. USING + SET NOT NULL)", `
begin;
alter table pgflow.flows add column queue_mode text not null default 'flow';
alter table pgflow.steps add column queue_name text;
alter table pgflow.steps alter column queue_name type text using lower(flow_slug),
                         alter column queue_name set not null;
alter table pgflow.step_tasks add column queue_name text;
alter table pgflow.step_tasks alter column queue_name type text using lower(flow_slug),
                              alter column queue_name set not null;
commit;`},
}

// psql runs sql through the psql binary next to the server binaries.
func psql(ctx context.Context, dsn, sql string) (time.Duration, error) {
	bin, err := pgprovider.FindBinDir()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn)
	cmd.Stdin = strings.NewReader(sql)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("psql: %w: %s", err, out)
	}
	return took, nil
}

// measureReferences returns one row per reference and size.
func measureReferences(ctx context.Context, env *Env, size int64) ([]Row, error) {
	var rows []Row
	for _, ref := range applyReferences {
		var times []time.Duration
		for i := 0; i < env.Repeat; i++ {
			dsn, drop, err := env.Clone(ctx, size)
			if err != nil {
				return nil, err
			}
			took, err := psql(ctx, dsn, ref.sql)
			drop()
			if err != nil {
				return nil, fmt.Errorf("%s at %d rows: %w", ref.name, size, err)
			}
			times = append(times, took)
		}
		m := Median(times).Seconds()
		rows = append(rows, Row{Benchmark: "apply", Case: fmt.Sprintf("%s, %d step_tasks", ref.name, size),
			Metrics: []Metric{{"total", m, "s"}, {"ACCESS EXCLUSIVE window", m, "s"}}})
	}
	return rows, nil
}
