package capture

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Rows of the captured schemas (version 2) travel in COPY's text format,
// one record per row: the server prints every value with its type's output
// function and reads it back with the input function, so every type comes
// back exactly, and the restore is a COPY. Redaction happens in the
// capture's SELECT, before a value leaves the server.

// redactedExpr replaces a jsonb value: an array keeps its length (a map
// step fans out over it), anything else becomes "<redacted>".
const redactedExpr = `case when %[1]s is null then null
	when pg_catalog.jsonb_typeof(%[1]s) operator(pg_catalog.=) 'array' then coalesce((select pg_catalog.jsonb_agg(%[2]s::pg_catalog.text) from pg_catalog.jsonb_array_elements(%[1]s) e), '[]'::pg_catalog.jsonb)
	else pg_catalog.to_jsonb(%[2]s::pg_catalog.text) end`

// redactedColumns are the columns of pgflow's tables that hold user data.
var redactedColumns = map[string][]string{
	"pgflow.runs":        {"input", "output"},
	"pgflow.step_states": {"output"},
	"pgflow.step_tasks":  {"output"},
}

// copyRows writes every row of table (a TableStat with its columns) as
// COPY text records.
func copyRows(ctx context.Context, tx pgx.Tx, t TableStat, redactRows bool, put func(Record) error) error {
	s, name, _ := strings.Cut(t.Table, ".")
	hide := map[string]bool{}
	if redactRows {
		for _, c := range redactedColumns[t.Table] {
			hide[c] = true
		}
	}
	sel := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		q := pgx.Identifier{c}.Sanitize()
		sel[i] = q
		if hide[c] {
			sel[i] = fmt.Sprintf(redactedExpr, q, quoteLiteral(Redacted)) + " as " + q
		}
	}
	sql := "copy (select " + strings.Join(sel, ", ") + " from " + pgx.Identifier{s, name}.Sanitize() + ") to stdout"
	lw := &lineWriter{emit: func(line string) error { return put(Record{Table: t.Table, Copy: &line}) }}
	if _, err := tx.Conn().PgConn().CopyTo(ctx, lw, sql); err != nil {
		return fmt.Errorf("capture: reading %s: %w", t.Table, err)
	}
	if lw.buf.Len() > 0 {
		return fmt.Errorf("capture: reading %s: COPY ended inside a row", t.Table)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// lineWriter cuts COPY's output into rows (COPY text escapes newlines in
// values: a row is one line). It holds at most one row.
type lineWriter struct {
	buf  bytes.Buffer
	emit func(string) error
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf.Write(p)
			break
		}
		w.buf.Write(p[:i])
		if err := w.emit(w.buf.String()); err != nil {
			return 0, err
		}
		w.buf.Reset()
		p = p[i+1:]
	}
	return n, nil
}

// validCopyLine: one row, nothing that could end the COPY early or start
// another row.
func validCopyLine(s string) bool {
	return !strings.ContainsAny(s, "\n\r") && s != `\.`
}

// copyIn restores the rows of one table by COPY, starting with first and
// reading records from next while they are rows of the same table. It
// returns the first record that is not (ok false at the end of the file).
func copyIn(ctx context.Context, tx pgx.Tx, h Header, first Record, next func() (Record, bool, error)) (Record, bool, error) {
	var cols []string
	for _, t := range h.Tables {
		if t.Table == first.Table {
			cols = t.Columns
		}
	}
	s, name, _ := strings.Cut(first.Table, ".")
	quoted := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	r := &copyReader{table: first.Table, next: next, line: []byte(*first.Copy + "\n")}
	sql := "copy " + pgx.Identifier{s, name}.Sanitize() + " (" + strings.Join(quoted, ", ") + ") from stdin"
	_, err := tx.Conn().PgConn().CopyFrom(ctx, r, sql)
	if r.err != nil {
		return Record{}, false, r.err
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("restore: copying the rows of %s: %w", first.Table, err)
	}
	return r.pending, r.more, nil
}

// copyReader feeds COPY the rows of one table, one record at a time.
type copyReader struct {
	table   string
	next    func() (Record, bool, error)
	line    []byte
	pending Record // the first record of something else
	more    bool   // pending is a record (not the end of the file)
	err     error  // a problem with the file (ErrBadCapture)
	done    bool
}

func (r *copyReader) Read(p []byte) (int, error) {
	for len(r.line) == 0 {
		if r.done {
			return 0, io.EOF
		}
		rec, ok, err := r.next()
		if err != nil {
			r.err = err
			return 0, err
		}
		if !ok || rec.Copy == nil || rec.Table != r.table {
			r.pending, r.more, r.done = rec, ok, true
			return 0, io.EOF
		}
		r.line = append(r.line[:0], *rec.Copy...)
		r.line = append(r.line, '\n')
	}
	n := copy(p, r.line)
	r.line = r.line[n:]
	return n, nil
}
