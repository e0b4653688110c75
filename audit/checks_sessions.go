package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func checkLongTransactions(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("sessions.long_transactions")
	var n, hidden int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with a as materialized (
		  select a.pid, a.usename, a.application_name, a.state, a.xact_start, a.state_change, a.wait_event_type, a.query
		  from pg_catalog.pg_stat_activity a
		  where a.datname = pg_catalog.current_database() and a.pid <> pg_catalog.pg_backend_pid()
		    and coalesce(a.backend_type, 'client backend') = 'client backend' -- null: hidden from this role
		),
		l as (
		  select * from a
		  where a.xact_start < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
		     or (a.state like 'idle in transaction%' and a.state_change < pg_catalog.now() - pg_catalog.make_interval(secs => $3))
		)
		select (select pg_catalog.count(*) from l),
		       (select pg_catalog.count(*) from a where a.query = '<insufficient privilege>'),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'user', l.usename, 'application_name', l.application_name,
		                  'state', l.state, 'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)),
		                  'state_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.state_change)),
		                  'wait_event_type', l.wait_event_type, 'query', pg_catalog.left(l.query, 120))
		         from l order by l.xact_start limit $1))`, env.Sample, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)).Scan(&n, &hidden, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	var out []Finding
	if n > 0 {
		out = append(out, c.finding(n, fmt.Sprintf("%d session(s) with a transaction open over %gs or idle in transaction over %gs",
			n, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)), samples))
	}
	if hidden > 0 {
		f := c.finding(hidden, fmt.Sprintf("%d session(s) of other roles are not visible to this role (their state and transaction age are hidden)", hidden), nil)
		f.Severity, f.Remedy = Info, "Run the audit as a role with pg_read_all_stats (or pg_monitor) to see every session."
		out = append(out, f)
	}
	return out, nil
}

func checkLocksOnPgflow(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("sessions.locks_on_pgflow")
	var n int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with l as materialized (
		  select l.pid, l.mode, l.granted, c.relname::text as relname, a.usename, a.application_name, a.state, a.xact_start
		  from pg_catalog.pg_locks l
		  join pg_catalog.pg_class c on c.oid = l.relation
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgflow'
		  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
		  where l.locktype = 'relation'
		    and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = pg_catalog.current_database())
		    and l.pid <> pg_catalog.pg_backend_pid()
		    and (l.mode not in ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
		         or not l.granted
		         or a.xact_start < pg_catalog.now() - interval '5 seconds')
		)
		select (select pg_catalog.count(*) from l),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'table', 'pgflow.' || l.relname, 'mode', l.mode, 'granted', l.granted,
		                  'user', l.usename, 'application_name', l.application_name, 'state', l.state,
		                  'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)))
		         from l order by l.granted desc, l.xact_start nulls last, l.pid limit $1))`, env.Sample).Scan(&n, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_locks: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d lock(s) on pgflow tables that apply would wait behind", n), samples)}, nil
}

func checkSizes(ctx context.Context, q Querier, env Env) ([]Finding, error) {
	c := check("size.tables")
	rows, err := q.Query(ctx, `
		select n.nspname::text, c.relname::text, c.reltuples::bigint, pg_catalog.pg_total_relation_size(c.oid)
		from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		where c.relkind in ('r', 'p')
		  and (n.nspname = 'pgflow'
		       or (n.nspname = 'pgmq' and (c.relname::text like 'q\_%' or c.relname::text like 'a\_%')))
		order by 4 desc, 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", err)
	}
	defer rows.Close()
	type size struct {
		schema, table string
		rows, bytes   int64
	}
	var pgflowT, queueT []size
	var stepTasks *size
	var pgflowBytes, queueBytes, queueRows int64
	for rows.Next() {
		var s size
		if err := rows.Scan(&s.schema, &s.table, &s.rows, &s.bytes); err != nil {
			return nil, fmt.Errorf("reading table sizes: %w", err)
		}
		if s.schema == "pgflow" {
			pgflowT = append(pgflowT, s)
			pgflowBytes += s.bytes
			if s.table == "step_tasks" {
				st := s
				stepTasks = &st
			}
		} else {
			queueT = append(queueT, s)
			queueBytes += s.bytes
			if s.rows > 0 {
				queueRows += s.rows
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", err)
	}
	toSamples := func(list []size) []map[string]any {
		var out []map[string]any
		for _, s := range list {
			if len(out) >= env.Sample {
				break
			}
			out = append(out, map[string]any{"table": s.schema + "." + s.table, "rows_estimate": s.rows, "bytes": s.bytes, "size": humanBytes(s.bytes)})
		}
		return out
	}
	var out []Finding
	f := c.finding(int64(len(pgflowT)), fmt.Sprintf("%d pgflow tables, %s in total", len(pgflowT), humanBytes(pgflowBytes)), toSamples(pgflowT))
	out = append(out, f)
	f = c.finding(int64(len(queueT)), fmt.Sprintf("%d pgmq queue tables, %s in total, about %d messages", len(queueT), humanBytes(queueBytes), queueRows), toSamples(queueT))
	out = append(out, f)
	if stepTasks != nil && env.Schema.State != versions.SchemaUpgraded {
		rowsText := fmt.Sprintf("about %d rows", stepTasks.rows)
		if stepTasks.rows < 0 {
			rowsText = "row count unknown: never analyzed"
		}
		f = c.finding(max(stepTasks.rows, 0), fmt.Sprintf("backfill: pgflow.step_tasks (%s, %s with indexes) is rewritten under ACCESS EXCLUSIVE",
			rowsText, humanBytes(stepTasks.bytes)),
			[]map[string]any{{"table": "pgflow.step_tasks", "rows_estimate": stepTasks.rows, "bytes": stepTasks.bytes, "size": humanBytes(stepTasks.bytes)}})
		out = append(out, f)
	}
	return out, nil
}

func humanBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// seconds of d, or def when d is unset.
func seconds(d time.Duration, def float64) float64 {
	if d <= 0 {
		return def
	}
	return d.Seconds()
}
