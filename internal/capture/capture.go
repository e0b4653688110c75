package capture

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The capture file (docs/fixtures.md "Capture file format"): gzip-compressed
// JSON lines. Line 1 is the Header; then one Record per line; the last line
// is the trailer {"end": {"records": N}} so a truncated file is detected.
//
// Version 2 (the version written now) holds what rebuilds the
// database exactly, in the order a restore needs it: the "pre" DDL of the
// captured schemas, their rows, the pgmq queues and their messages, the
// sequence positions, then the "post" DDL (constraints, indexes, triggers,
// grants, comments). Version 1 files (rows only, restored into the
// project's own 0.16.0 baseline) are still read.

// Format and Version identify the file; Version is the
// version Write writes.
const (
	Format  = "pgflow-upgrade-capture"
	Version = 2
)

// Header is the first line of a capture file.
type Header struct {
	Format      string    `json:"format"`
	Version     int       `json:"version"`
	PgflowState string    `json:"pgflow_state"` // audit schema state: "baseline" for pgflow 0.16.0, "older", "upgraded"
	CreatedAt   time.Time `json:"created_at"`
	Redacted    bool      `json:"redacted"`
	Source      string    `json:"source,omitempty"` // host/database, never a password

	// Version 2.
	// Schemas: the schemas whose DDL and rows the file holds, pgflow first.
	Schemas       []string `json:"schemas,omitempty"`
	PgflowVersion string   `json:"pgflow_version,omitempty"` // versions.Detect's Found ("0.16.0")
	PGMQ          string   `json:"pgmq,omitempty"`           // "extension 1.5.1" or "stand-in"
	ServerVersion string   `json:"server_version,omitempty"`
	// Roles named by the schemas' grants and policies (replay creates the
	// missing ones, NOLOGIN).
	Roles []string `json:"roles,omitempty"`
	// Extensions the captured schemas' objects use (a column's type, a
	// function's argument...): replay creates them, in their schema.
	Extensions []Extension `json:"extensions,omitempty"`
	// Tables: every captured table with its exact row count and size on disk.
	Tables []TableStat `json:"tables,omitempty"`
	// Release: where the captured pgflow sits on upstream's line of files,
	// which is where a rehearsal's plan starts. Absent from files written
	// before captures of other releases than 0.16.0 were accepted: those
	// are replayed only when their state is "baseline" (0.16.0).
	Release *Release `json:"release,omitempty"`
}

// Release is the captured database's place on upstream's line of files
// (versions.ReleaseState).
type Release struct {
	// Files: the database held upstream's first Files files.
	Files int    `json:"files"`
	Name  string `json:"name"` // versions.StateName(Files): "0.14.1", "0.17.0"...
	// LedgerFiles: how many of upstream's files the Supabase ledger
	// recorded (-1: no ledger, or not readable by the capturing role); the
	// restored copy's ledger records the same.
	LedgerFiles int `json:"ledger_files"`
}

// Extension is an extension and the schema it was installed in.
type Extension struct {
	Name   string `json:"name"`
	Schema string `json:"schema"`
}

// TableStat is one captured table's size in the source database.
type TableStat struct {
	Table string `json:"table"` // schema.table
	Rows  int64  `json:"rows"`
	Bytes int64  `json:"bytes"` // pg_total_relation_size: heap, indexes, TOAST
	// Columns: the columns of its COPY rows, in order (not for pgmq's
	// tables, whose messages are JSON rows).
	Columns []string `json:"columns,omitempty"`
}

// Rows returns the captured row count of table ("pgflow.step_tasks"), -1 when absent.
func (h Header) Rows(table string) int64 {
	for _, t := range h.Tables {
		if t.Table == table {
			return t.Rows
		}
	}
	return -1
}

// Record is one line after the header: a DDL statement, a row, a queue, a
// queue or archive message, or a sequence position.
type Record struct {
	// Table is "<schema>.<table>" (a captured schema), "pgmq.queue" (a row
	// of pgmq.list_queues()), "pgmq.q" or "pgmq.a" (a message of queue
	// Queue, live or archived). Empty for DDL and sequence records.
	Table string          `json:"table,omitempty"`
	Queue string          `json:"queue,omitempty"`
	Row   json.RawMessage `json:"row,omitempty"`
	// Copy is a row of a captured schema's table in COPY's text format,
	// the columns those of the header's Tables (version 2).
	Copy *string `json:"copy,omitempty"`
	// DDL is one statement of Section "pre" or "post" (version 2).
	DDL     string `json:"ddl,omitempty"`
	Section string `json:"section,omitempty"`
	// Seq is a sequence's position (version 2).
	Seq *SeqPos `json:"seq,omitempty"`
}

// SeqPos is where a sequence stood: Sequence by name, or the sequence of
// Table's Column (a pgmq queue's msg_id, whatever pgmq named it).
type SeqPos struct {
	Sequence  string `json:"sequence,omitempty"`
	Table     string `json:"table,omitempty"`
	Column    string `json:"column,omitempty"`
	LastValue int64  `json:"last_value"`
	IsCalled  bool   `json:"is_called"`
}

type trailer struct {
	End *struct {
		Records int `json:"records"`
	} `json:"end"`
}

// captureTables are the pgflow tables in restore (foreign key) order (the
// order of version 1 files).
var captureTables = []string{"flows", "steps", "deps", "workers", "worker_functions", "runs", "step_states", "step_tasks"}

// ErrBadCapture is wrapped by every error about a damaged or foreign file.
var ErrBadCapture = errors.New("not a usable pgflow-upgrade capture file")

// Options configure Write.
type Options struct {
	// Redact replaces runs.input and the outputs of step_states and
	// step_tasks (and runs.output) with placeholders that keep their shape
	// where the engine depends on it: an array keeps its length (a map step
	// fans out over it), every other value becomes "<redacted>". Rows of
	// IncludeSchemas are not redacted.
	Redact bool
	Source string
	// IncludeSchemas are more schemas captured with pgflow (DDL and rows):
	// a schema of the user's that references pgflow.
	IncludeSchemas []string
}

// Redacted is the placeholder value.
const Redacted = "<redacted>"

// reservedSchemas cannot be included: pgmq is rebuilt by pgmq itself.
var reservedSchemas = map[string]bool{"pgflow": true, "pgmq": true, "pg_catalog": true, "information_schema": true, "pg_toast": true}

// Write writes the database of conn, in one REPEATABLE READ, READ ONLY
// snapshot: the DDL of schema pgflow (and of opts.IncludeSchemas), their
// rows, pgmq's queues with their live and archived messages and sequence
// positions. It streams: memory holds one row at a time. It returns the
// number of records.
func Write(ctx context.Context, conn *pgx.Conn, w io.Writer, opts Options) (int, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("capture: opening a read-only snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// search_path empty: every name the server prints carries its schema.
	if _, err := tx.Exec(ctx, "set local timezone to 'UTC'; set local search_path to ''"); err != nil {
		return 0, fmt.Errorf("capture: %w", err)
	}
	info, err := versions.DetectSchema(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("capture: detecting the pgflow schema: %w", err)
	}
	if !info.HasTables {
		return 0, fmt.Errorf("capture: the database has no pgflow tables (state %s)", info.State)
	}
	// A capture is for a rehearsal of apply's plan: a state no plan starts
	// from is refused here, with the reason, rather than at the replay.
	d := info.Version
	if !d.PlanStarts() {
		return 0, fmt.Errorf("capture: %w: %s. Next: %s", ErrNoPlan, d.Summary(), d.NextStep)
	}
	h := Header{Format: Format, Version: Version, PgflowState: string(info.State),
		CreatedAt: time.Now().UTC().Truncate(time.Second), Redacted: opts.Redact, Source: opts.Source,
		Release: &Release{Files: d.Release.Files, Name: d.Release.Name, LedgerFiles: d.Release.LedgerFiles}}
	if err := describe(ctx, tx, &h, opts.IncludeSchemas, d); err != nil {
		return 0, err
	}
	queues, err := QueueNames(ctx, tx)
	if err != nil {
		return 0, err
	}
	phys := physicalQueues(queues)
	if err := tableStats(ctx, tx, &h, phys); err != nil {
		return 0, err
	}

	zw := gzip.NewWriter(w)
	bw := bufio.NewWriter(zw)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(h); err != nil {
		return 0, err
	}
	n := 0
	rows := map[string]int{}
	put := func(r Record) error {
		if r.Table != "" {
			rows[r.Table]++
		}
		if err := validText(r, rows[r.Table]); err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("capture: writing: %w", err)
		}
		n++
		return nil
	}
	ddl := func(section string) func(string) error {
		return func(stmt string) error { return put(Record{DDL: stmt, Section: section}) }
	}
	emit := func(table, queue, sql string) error {
		rows, err := tx.Query(ctx, sql)
		if err != nil {
			return fmt.Errorf("capture: reading %s %s: %w", table, queue, err)
		}
		defer rows.Close()
		for rows.Next() {
			var raw []byte
			if err := rows.Scan(&raw); err != nil {
				return fmt.Errorf("capture: reading %s %s: %w", table, queue, err)
			}
			if err := put(Record{Table: table, Queue: queue, Row: raw}); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if err := schemaDDL(ctx, tx, h.Schemas, preDDL, ddl("pre")); err != nil {
		return n, err
	}
	for _, t := range h.Tables {
		if strings.HasPrefix(t.Table, "pgmq.") {
			continue
		}
		if err := copyRows(ctx, tx, t, opts.Redact, put); err != nil {
			return n, err
		}
	}
	if err := emit("pgmq.queue", "", `select pg_catalog.to_jsonb(q) from pgmq.list_queues() q order by q.queue_name`); err != nil {
		return n, err
	}
	// Case-only aliases share one physical table: its rows are written once.
	for _, q := range phys {
		for _, kind := range []string{"q", "a"} {
			sql := "select pg_catalog.to_jsonb(m) from " + pgx.Identifier{"pgmq", kind + "_" + q.phys}.Sanitize() + " m order by m.msg_id"
			if err := emit("pgmq."+kind, q.name, sql); err != nil {
				return n, err
			}
		}
	}
	seqs, err := sequencePositions(ctx, tx, h.Schemas, phys)
	if err != nil {
		return n, err
	}
	for i := range seqs {
		if err := put(Record{Seq: &seqs[i]}); err != nil {
			return n, err
		}
	}
	if err := schemaDDL(ctx, tx, h.Schemas, postDDL, ddl("post")); err != nil {
		return n, err
	}
	if err := enc.Encode(map[string]any{"end": map[string]int{"records": n}}); err != nil {
		return n, err
	}
	if err := bw.Flush(); err != nil {
		return n, err
	}
	if err := zw.Close(); err != nil {
		return n, err
	}
	return n, nil
}

// ErrNotUTF8 is returned by Write for a database whose text is not UTF-8
// (a SQL_ASCII database keeps any bytes): JSON would carry U+FFFD in their
// place, and a replay would rehearse on other data than the database's.
var ErrNotUTF8 = errors.New("the database holds text that is not valid UTF-8")

// validText refuses a record whose text is not UTF-8; row is its position
// among its table's records.
func validText(r Record, row int) error {
	var text string
	switch {
	case r.Copy != nil:
		text = *r.Copy
	case r.Row != nil:
		text = string(r.Row)
	case r.DDL != "":
		text = r.DDL
	default:
		return nil
	}
	if utf8.ValidString(text) {
		return nil
	}
	what := "the " + r.Section + " DDL"
	if r.Table != "" {
		what = fmt.Sprintf("row %d of %s", row, r.Table)
		if r.Queue != "" {
			what += " (queue " + r.Queue + ")"
		}
	}
	return fmt.Errorf("%w: %s (the database's encoding is not UTF8, e.g. SQL_ASCII, which keeps any bytes); "+
		"a capture would not hold the same text: correct that text, or capture a copy converted to UTF8", ErrNotUTF8, what)
}

// QueueNames lists pgmq's queues (the scenarios' census and the
// rehearsal's digest list them the same way).
func QueueNames(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := q.Query(ctx, `select queue_name::text from pgmq.list_queues() order by 1`)
	if err != nil {
		return nil, fmt.Errorf("listing pgmq queues: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing pgmq queues: %w", err)
	}
	return names, nil
}
