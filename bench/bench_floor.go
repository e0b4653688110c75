package bench

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// floorBatchRows: rows per ctid-range batch of the floor.
const floorBatchRows = 10000

// floor is the physical floor the online table is measured against: the
// least an online change of the same end objects has to do, with nothing
// else (no preflight, no progress, no SKIP LOCKED, no switch): the columns
// added nullable, steps filled in one statement, step_tasks in ctid-range
// batches of about 10k rows (autocommit) up to the size the table had when
// it began, then the three unique indexes CREATE UNIQUE INDEX CONCURRENTLY
// (the migration file's definitions), then on both tables CHECK NOT VALID
// (NOT NULL and 0.17.0's queue_name_is_valid) + VALIDATE + SET NOT NULL.
func floor(ctx context.Context, conn *pgx.Conn) (map[string]time.Duration, error) {
	steps := map[string]time.Duration{}
	timed := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		steps[name] += time.Since(t)
		return err
	}
	exec := func(sqls ...string) error {
		for _, s := range sqls {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("floor: %s: %w", strings.Join(strings.Fields(s), " "), err)
			}
		}
		return nil
	}
	fn, idx, err := fileStatements()
	if err != nil {
		return nil, err
	}
	if err := timed("expand", func() error {
		return exec(`alter table pgflow.steps add column queue_name text`, `alter table pgflow.step_tasks add column queue_name text`)
	}); err != nil {
		return nil, err
	}
	if err := timed("backfill", func() error {
		if err := exec(`update pgflow.steps set queue_name = lower(flow_slug)`); err != nil {
			return err
		}
		var blocks int64
		var rpb float64
		if err := conn.QueryRow(ctx, `select pg_relation_size('pgflow.step_tasks') / current_setting('block_size')::bigint,
			case when relpages > 0 and reltuples > 0 then reltuples / relpages else 50 end
			from pg_class where oid = 'pgflow.step_tasks'::regclass`).Scan(&blocks, &rpb); err != nil {
			return err
		}
		n := max(1, int64(floorBatchRows/rpb))
		for b := int64(0); b < blocks; b += n {
			if _, err := conn.Exec(ctx, `update pgflow.step_tasks set queue_name = lower(flow_slug)
				where ctid >= $1::tid and ctid < $2::tid`, fmt.Sprintf("(%d,0)", b), fmt.Sprintf("(%d,0)", b+n)); err != nil {
				return fmt.Errorf("floor: batch at block %d: %w", b, err)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := timed("indexes", func() error { return exec(idx...) }); err != nil {
		return nil, err
	}
	if err := timed("checks", func() error {
		if err := exec(fn); err != nil {
			return err
		}
		for _, t := range []string{"steps", "step_tasks"} {
			if err := exec(
				`alter table pgflow.`+t+` add constraint queue_name_not_null check (queue_name is not null) not valid,
				   add constraint queue_name_is_valid check (pgflow.is_valid_queue_name(queue_name)) not valid`,
				`alter table pgflow.`+t+` validate constraint queue_name_not_null`,
				`alter table pgflow.`+t+` validate constraint queue_name_is_valid`,
				`alter table pgflow.`+t+` alter column queue_name set not null`); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return steps, nil
}

// fileStatements: the migration file's is_valid_queue_name and its three
// unique indexes, made CONCURRENTLY.
func fileStatements() (fn string, idx []string, err error) {
	all, err := migrations.All()
	if err != nil {
		return "", nil, err
	}
	sql := ""
	for _, m := range all {
		if m.Version == upgrade.Version {
			sql = m.SQL
		}
	}
	for _, name := range []string{"idx_flows_normalized_slug", "idx_steps_normalized_slug", "idx_step_tasks_queue_message"} {
		loc := regexp.MustCompile(`create unique index if not exists ` + name + `\s`).FindStringIndex(sql)
		if loc == nil {
			return "", nil, fmt.Errorf("floor: the migration file does not create %s", name)
		}
		st := sql[loc[1]:]
		st = st[:strings.Index(st, ";")]
		idx = append(idx, "create unique index concurrently "+name+" "+strings.Join(strings.Fields(st), " "))
	}
	const fhead = "create or replace function pgflow.is_valid_queue_name("
	i := strings.Index(sql, fhead)
	if i < 0 || !strings.Contains(sql[i:], "$$;") {
		return "", nil, fmt.Errorf("floor: the migration file has no %q", fhead)
	}
	j := strings.Index(sql[i:], "$$;")
	return sql[i : i+j+3], idx, nil
}
