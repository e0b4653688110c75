package audit

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// sizeTables is size.tables.
var sizeTables = Check{
	ID: "size.tables", Title: "table sizes and backfill estimate", Severity: Info, Runs: InAudit,
	Needs: NeedsPgflow,
	Meaning: "Rows (pg_class.reltuples, as of the last ANALYZE; a queue table never analysed is counted instead, up to 10,000 rows each for 20 tables, and the message says which) and bytes (pg_total_relation_size) of the pgflow tables and queue tables. " +
		"The upgrade writes queue_name into every pgflow.step_tasks row and builds its unique index under ACCESS EXCLUSIVE: that is the backfill work and the lock window.",
	Remedy: "Plan the window from the step_tasks size (measure with apply --dry-run on a restored copy); prune old runs first to shrink it.",
	Run:    checkSizes,
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

// size is one table's row estimate (pg_class.reltuples; -1 never
// analysed, or, for a queue table, the rows counted) and bytes.
type size struct {
	schema, table string
	rows, bytes   int64
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
