// Package fingerprint is the state-survival check of the upgrade:
// a fingerprint of every row of the pgflow tables and of every pgmq queue,
// queue message and archived message, taken before the upgrade and compared
// with one taken after it. A row that disappeared, a column value that
// changed, a queue that is gone: each is a Diff naming the table, the row's
// key and what changed. Columns the upgrade adds are ignored by Compare and
// checked separately by CheckNewColumns.
//
// This is a test and replay tool, not the hot path: it reads the pgmq queue
// tables directly (pgmq has no public function that lists a queue without
// changing it), in one REPEATABLE READ, READ ONLY transaction.
package fingerprint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Tables are the pgflow tables whose rows must survive the upgrade, keyed by
// their primary keys.
var Tables = []string{"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers", "worker_functions"}

// Beginner opens a transaction: a *pgx.Conn or a *pgxpool.Pool.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Queryer runs a query: a connection, a pool or a transaction.
type Queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Row is one row: column name → the column's value as canonical JSON text
// (jsonb's output, timestamps in UTC).
type Row map[string]string

// Hash is a digest of the row's values in column order.
func (r Row) Hash(columns []string) string {
	h := sha256.New()
	for _, c := range columns {
		v, ok := r[c]
		if !ok {
			v = "\x00absent"
		}
		fmt.Fprintf(h, "%d:%s=%d:%s;", len(c), c, len(v), v)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Table is the fingerprint of one table (or one queue's message table).
type Table struct {
	Name    string         // e.g. "pgflow.runs", "pgmq queue foo", "pgmq archive foo"
	Columns []string       // the columns when the fingerprint was taken
	Key     []string       // the columns that make up Rows' keys
	Rows    map[string]Row // key (JSON array of the key columns' values) → row
}

// Fingerprint is the state of a pgflow database at one moment.
type Fingerprint struct {
	Tables map[string]*Table
}

// RowCount is the number of rows over all tables.
func (f *Fingerprint) RowCount() int {
	n := 0
	for _, t := range f.Tables {
		n += len(t.Rows)
	}
	return n
}

// Count returns the number of rows of one table ("pgflow.runs", "pgmq queue x").
func (f *Fingerprint) Count(table string) int {
	if t, ok := f.Tables[table]; ok {
		return len(t.Rows)
	}
	return 0
}

// QueueTable and ArchiveTable name a queue's message tables in a Fingerprint.
func QueueTable(queue string) string   { return "pgmq queue " + queue }
func ArchiveTable(queue string) string { return "pgmq archive " + queue }

// QueueList names the fingerprint of pgmq.list_queues().
const QueueList = "pgmq queues"

// Take fingerprints the database in one consistent snapshot.
func Take(ctx context.Context, db Beginner) (*Fingerprint, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("fingerprint: opening a read-only snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// to_jsonb renders timestamps in the session time zone: pin it.
	if _, err := tx.Exec(ctx, "set local timezone to 'UTC'"); err != nil {
		return nil, fmt.Errorf("fingerprint: setting the time zone: %w", err)
	}
	fp := &Fingerprint{Tables: map[string]*Table{}}
	for _, name := range Tables {
		t, err := takeTable(ctx, tx, "pgflow", name, "pgflow."+name, nil)
		if err != nil {
			return nil, err
		}
		if t != nil {
			fp.Tables[t.Name] = t
		}
	}

	queues, err := takeQueues(ctx, tx)
	if err != nil {
		return nil, err
	}
	fp.Tables[QueueList] = queues
	for _, key := range sortedKeys(queues.Rows) {
		var name string
		if err := json.Unmarshal([]byte(queues.Rows[key]["queue_name"]), &name); err != nil {
			return nil, fmt.Errorf("fingerprint: queue name %s: %w", queues.Rows[key]["queue_name"], err)
		}
		// pgmq names the tables after the lowercased queue name.
		lower := strings.ToLower(name)
		for _, kind := range []struct{ prefix, label string }{{"q_", QueueTable(name)}, {"a_", ArchiveTable(name)}} {
			t, err := takeTable(ctx, tx, "pgmq", kind.prefix+lower, kind.label, []string{"msg_id"})
			if err != nil {
				return nil, err
			}
			if t == nil {
				return nil, fmt.Errorf("fingerprint: pgmq lists queue %q but table pgmq.%s does not exist", name, kind.prefix+lower)
			}
			fp.Tables[t.Name] = t
		}
	}
	return fp, nil
}

func takeQueues(ctx context.Context, tx pgx.Tx) (*Table, error) {
	t := &Table{Name: QueueList, Columns: []string{"queue_name", "is_partitioned", "is_unlogged", "created_at"},
		Key: []string{"queue_name"}, Rows: map[string]Row{}}
	rows, err := tx.Query(ctx, `select to_jsonb(q) from pgmq.list_queues() q`)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: listing pgmq queues: %w", err)
	}
	if err := collect(rows, t); err != nil {
		return nil, fmt.Errorf("fingerprint: listing pgmq queues: %w", err)
	}
	return t, nil
}

// takeTable fingerprints schema.table; nil when the table does not exist.
// key overrides the primary key (pgmq tables of partitioned queues have none).
func takeTable(ctx context.Context, tx pgx.Tx, schema, table, label string, key []string) (*Table, error) {
	var columns, pk []string
	var exists bool
	err := tx.QueryRow(ctx, `
		select c.oid is not null,
		       coalesce((select array_agg(a.attname::text order by a.attnum) from pg_catalog.pg_attribute a
		                 where a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped), '{}'),
		       coalesce((select array_agg(a.attname::text order by k.ord)
		                 from pg_catalog.pg_index i
		                 cross join lateral unnest(i.indkey::int2[]) with ordinality k(attnum, ord)
		                 join pg_catalog.pg_attribute a on a.attrelid = c.oid and a.attnum = k.attnum
		                 where i.indrelid = c.oid and i.indisprimary), '{}')
		from (select 1) one
		left join pg_catalog.pg_class c
		  on c.relname = $2 and c.relnamespace = (select n.oid from pg_catalog.pg_namespace n where n.nspname = $1)`,
		schema, table).Scan(&exists, &columns, &pk)
	if err != nil {
		return nil, fmt.Errorf("fingerprint: reading the columns of %s.%s: %w", schema, table, err)
	}
	if !exists {
		return nil, nil
	}
	if key == nil {
		key = pk
	}
	if len(key) == 0 {
		// No primary key: every column is the key, so a changed row shows as
		// one missing and one added row.
		key = columns
	}
	t := &Table{Name: label, Columns: columns, Key: key, Rows: map[string]Row{}}
	rows, err := tx.Query(ctx, "select to_jsonb(t) from "+pgx.Identifier{schema, table}.Sanitize()+" t")
	if err != nil {
		return nil, fmt.Errorf("fingerprint: reading %s.%s: %w", schema, table, err)
	}
	if err := collect(rows, t); err != nil {
		return nil, fmt.Errorf("fingerprint: reading %s.%s: %w", schema, table, err)
	}
	return t, nil
}

func collect(rows pgx.Rows, t *Table) error {
	defer rows.Close()
	for rows.Next() {
		var raw []byte
		if err := rows.Scan(&raw); err != nil {
			return err
		}
		var cols map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cols); err != nil {
			return err
		}
		row := make(Row, len(cols))
		for c, v := range cols {
			row[c] = string(v)
		}
		k := rowKey(row, t.Key)
		if _, dup := t.Rows[k]; dup {
			return fmt.Errorf("two rows with key %s", k)
		}
		t.Rows[k] = row
	}
	return rows.Err()
}

func rowKey(r Row, key []string) string {
	parts := make([]string, len(key))
	for i, c := range key {
		v, ok := r[c]
		if !ok {
			v = "null"
		}
		parts[i] = v
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Diff is one difference between two fingerprints, or one wrong new value.
type Diff struct {
	Table  string `json:"table"`
	Key    string `json:"key,omitempty"`    // the row's key columns as a JSON array
	What   string `json:"what"`             // table missing | row missing | row added | column missing | changed | wrong value
	Column string `json:"column,omitempty"` // for changed / column missing / wrong value
	Before string `json:"before,omitempty"`
	After  string `json:"after,omitempty"`
}

// Kinds of Diff.
const (
	TableMissing  = "table missing"
	RowMissing    = "row missing"
	RowAdded      = "row added"
	ColumnMissing = "column missing"
	Changed       = "changed"
	WrongValue    = "wrong value"
)

func (d Diff) String() string {
	s := d.Table
	if d.Key != "" {
		s += " " + d.Key
	}
	s += ": " + d.What
	if d.Column != "" {
		s += " " + d.Column
	}
	if d.Before != "" || d.After != "" {
		s += fmt.Sprintf(" (before %s, after %s)", short(d.Before), short(d.After))
	}
	return s
}

func short(s string) string {
	if s == "" {
		return "-"
	}
	if len(s) > 120 {
		return s[:117] + "..."
	}
	return s
}

// Compare lists what of before is not in after unchanged: missing tables,
// missing rows, columns that disappeared and changed values of the columns
// before had. Rows and columns that after adds are not differences (see
// Added). The result is sorted by table, key and column.
func Compare(before, after *Fingerprint) []Diff {
	var out []Diff
	for _, name := range sortedKeys(before.Tables) {
		bt := before.Tables[name]
		at, ok := after.Tables[name]
		if !ok {
			out = append(out, Diff{Table: name, What: TableMissing, Before: fmt.Sprintf("%d rows", len(bt.Rows))})
			continue
		}
		afterCols := map[string]bool{}
		for _, c := range at.Columns {
			afterCols[c] = true
		}
		for _, c := range bt.Columns {
			if !afterCols[c] {
				out = append(out, Diff{Table: name, What: ColumnMissing, Column: c})
			}
		}
		// Keys are compared as strings; a table whose key changed shape would
		// show every row as missing, which is what it is.
		for _, k := range sortedKeys(bt.Rows) {
			br := bt.Rows[k]
			ar, ok := at.Rows[k]
			if !ok {
				out = append(out, Diff{Table: name, Key: k, What: RowMissing, Before: br.Hash(bt.Columns)})
				continue
			}
			for _, c := range bt.Columns {
				if !afterCols[c] {
					continue
				}
				if br[c] != ar[c] {
					out = append(out, Diff{Table: name, Key: k, What: Changed, Column: c, Before: br[c], After: ar[c]})
				}
			}
		}
	}
	return out
}

// Added lists the rows and tables of after that before did not have (new
// rows written by traffic during the upgrade, say). Tables that before did
// not fingerprint at all are reported as a whole.
func Added(before, after *Fingerprint) []Diff {
	var out []Diff
	for _, name := range sortedKeys(after.Tables) {
		at := after.Tables[name]
		bt, ok := before.Tables[name]
		if !ok {
			out = append(out, Diff{Table: name, What: RowAdded, After: fmt.Sprintf("new table, %d rows", len(at.Rows))})
			continue
		}
		for _, k := range sortedKeys(at.Rows) {
			if _, ok := bt.Rows[k]; !ok {
				out = append(out, Diff{Table: name, Key: k, What: RowAdded, After: at.Rows[k].Hash(at.Columns)})
			}
		}
	}
	return out
}

// CheckNewColumns checks the values of the columns the upgrade to 0.17.0
// adds: every flow is in 'flow' mode (the default; no flow was step-mode
// before), and every step's and task's queue_name is lower(flow_slug), the
// flow's one queue. Call it right after the upgrade (later, step-mode flows
// may exist). A missing column is a Diff too.
func CheckNewColumns(ctx context.Context, q Queryer) ([]Diff, error) {
	var out []Diff
	for _, tc := range [][2]string{{"flows", "queue_mode"}, {"steps", "queue_name"}, {"step_tasks", "queue_name"}} {
		ok, err := hasColumn(ctx, q, tc[0], tc[1])
		if err != nil {
			return nil, err
		}
		if !ok {
			out = append(out, Diff{Table: "pgflow." + tc[0], What: ColumnMissing, Column: tc[1]})
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	checks := []struct {
		table, column, sql string
	}{
		{"pgflow.flows", "queue_mode", `select jsonb_build_array(f.flow_slug)::text, '"flow"', coalesce(to_jsonb(f.queue_mode)::text, 'null')
		                  from pgflow.flows f where f.queue_mode is distinct from 'flow' order by 1`},
		{"pgflow.steps", "queue_name", `select jsonb_build_array(s.flow_slug, s.step_slug)::text, to_jsonb(lower(s.flow_slug))::text,
		                         coalesce(to_jsonb(s.queue_name)::text, 'null')
		                  from pgflow.steps s where s.queue_name is distinct from lower(s.flow_slug) order by 1`},
		{"pgflow.step_tasks", "queue_name", `select jsonb_build_array(t.run_id, t.step_slug, t.task_index)::text,
		                              to_jsonb(lower(t.flow_slug))::text, coalesce(to_jsonb(t.queue_name)::text, 'null')
		                       from pgflow.step_tasks t
		                       where t.queue_name is distinct from lower(t.flow_slug) order by 1`},
	}
	for _, c := range checks {
		rows, err := q.Query(ctx, c.sql)
		if err != nil {
			return nil, fmt.Errorf("fingerprint: checking %s.%s: %w", c.table, c.column, err)
		}
		for rows.Next() {
			var key, want, got string
			if err := rows.Scan(&key, &want, &got); err != nil {
				rows.Close()
				return nil, fmt.Errorf("fingerprint: checking %s.%s: %w", c.table, c.column, err)
			}
			out = append(out, Diff{Table: c.table, Key: key, What: WrongValue, Column: c.column, Before: "want " + want, After: got})
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("fingerprint: checking %s.%s: %w", c.table, c.column, err)
		}
	}
	return out, nil
}

func hasColumn(ctx context.Context, q Queryer, table, column string) (bool, error) {
	rows, err := q.Query(ctx, `select exists (select 1 from pg_catalog.pg_attribute a
		where a.attrelid = pg_catalog.to_regclass('pgflow.' || $1) and a.attname = $2 and not a.attisdropped)`, table, column)
	if err != nil {
		return false, fmt.Errorf("fingerprint: looking for pgflow.%s.%s: %w", table, column, err)
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, fmt.Errorf("fingerprint: looking for pgflow.%s.%s: %w", table, column, err)
	}
	return ok, nil
}

// Format renders at most max diffs, one a line, with a count of the rest.
func Format(diffs []Diff, max int) string {
	var b strings.Builder
	for i, d := range diffs {
		if max > 0 && i >= max {
			fmt.Fprintf(&b, "... and %d more\n", len(diffs)-max)
			break
		}
		b.WriteString(d.String())
		b.WriteByte('\n')
	}
	return strings.TrimRight(b.String(), "\n")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
