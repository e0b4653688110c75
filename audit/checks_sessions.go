package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func checkLongTransactions(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
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

func checkLocksOnPgflow(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
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

// size is one table's row estimate (pg_class.reltuples; -1 never
// analysed, or, for a queue table, the rows counted) and bytes.
type size struct {
	schema, table string
	rows, bytes   int64
}

func checkSizes(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
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
			if s.rows >= 0 {
				queueRows += s.rows
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading table sizes: %w", err)
	}
	rows.Close()
	// A queue table never analysed has no estimate (reltuples -1): it is
	// counted instead, within a budget, so the total never reads 0 for
	// messages nobody estimated.
	var unanalysed []*size
	for i := range queueT {
		if queueT[i].rows < 0 {
			unanalysed = append(unanalysed, &queueT[i])
		}
	}
	counted, over, uncounted, err := countWithin(ctx, q, unanalysed, func(s *size) string { return pgx.Identifier{s.schema, s.table}.Sanitize() })
	if err != nil {
		return nil, err
	}
	queueRows += counted
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
	if len(queueT) > 0 { // no finding about no queue tables
		f = c.finding(int64(len(queueT)), fmt.Sprintf("%d pgmq queue tables, %s in total, %s", len(queueT), humanBytes(queueBytes),
			messagesText(queueRows, len(queueT), len(unanalysed), over, uncounted)), toSamples(queueT))
		out = append(out, f)
	}
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

// Counting the queue tables that were never analysed: at most
// countTablesBudget tables, each up to countRowsBudget rows (an index-only
// walk of a small table; a larger one says "at least").
const (
	countTablesBudget = 20
	countRowsBudget   = 10_000
)

// countWithin counts the rows of tables, each up to countRowsBudget, the
// first countTablesBudget of them; each counted table's rows become its
// count. over: tables with more rows than the budget; uncounted: tables
// beyond the table budget.
func countWithin(ctx context.Context, q Querier, tables []*size, name func(*size) string) (total int64, over, uncounted int, err error) {
	for i, t := range tables {
		if i >= countTablesBudget {
			return total, over, len(tables) - i, nil
		}
		var n int64
		// name is a quoted identifier of a table read from pg_class.
		if err := q.QueryRow(ctx, `select pg_catalog.count(*) from (select from `+name(t)+` limit $1) s`, countRowsBudget+1).Scan(&n); err != nil {
			return 0, 0, 0, fmt.Errorf("counting the rows of %s (never analysed): %w", name(t), err)
		}
		if n > countRowsBudget {
			n, over = countRowsBudget, over+1
		}
		t.rows = n
		total += n
	}
	return total, over, 0, nil
}

// messagesText says how many messages the queue tables hold and how that
// is known: estimates as of the last ANALYZE, counts for the tables never
// analysed.
func messagesText(n int64, tables, unanalysed, over, uncounted int) string {
	switch {
	case unanalysed == 0:
		return fmt.Sprintf("about %d messages (estimates as of the last ANALYZE)", n)
	case uncounted > 0:
		return fmt.Sprintf("at least %d messages (%d of %d tables never analysed; %d of them not counted: run ANALYZE on the pgmq tables for an estimate)", n, unanalysed, tables, uncounted)
	case over > 0:
		return fmt.Sprintf("at least %d messages (%d of %d tables never analysed, counted up to %d rows each; %d have more: run ANALYZE on the pgmq tables for an estimate)", n, unanalysed, tables, countRowsBudget, over)
	case unanalysed == tables:
		return fmt.Sprintf("%d messages (counted: the tables were never analysed)", n)
	}
	return fmt.Sprintf("about %d messages (%d of %d tables never analysed and counted, the others estimated as of the last ANALYZE)", n, unanalysed, tables)
}
