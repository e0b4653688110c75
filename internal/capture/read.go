package capture

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Reading a capture file (`fixtures replay --from`) is streamed: the file is
// read twice, once to validate it whole before any database is created, then
// again to restore it, and neither pass holds more than one line and one
// insert batch in memory, whatever the file's size. Limits name what a file
// may not exceed; a file over one is refused (ErrCaptureLimit, which also
// wraps ErrBadCapture) before anything is restored.

// Limits bound what reading a capture may cost.
type Limits struct {
	// MaxLineBytes is the longest line: one row as JSON (a run's input,
	// a step's output), decompressed.
	MaxLineBytes int
	// MaxRecords is the most records (rows, queues, messages) a file may hold.
	MaxRecords int
	// MaxBytes is the most decompressed bytes a file may hold (a gzip bomb
	// ends here).
	MaxBytes int64
	// MaxQueues is the most pgmq queues a file may declare (each becomes two
	// tables in the throwaway database).
	MaxQueues int
}

// DefaultLimits are the limits of `fixtures replay --from` (docs/fixtures.md).
// With them a replay's memory stays far below 256 MB: at most one line, and
// one insert batch of at most batchBytes plus one line, at a time.
var DefaultLimits = Limits{
	MaxLineBytes: 16 << 20,
	MaxRecords:   50_000_000,
	MaxBytes:     64 << 30,
	MaxQueues:    10_000,
}

// ErrCaptureLimit wraps every refusal for a limit of Limits.
var ErrCaptureLimit = errors.New("the capture file exceeds a limit")

// maxQueueName is pgmq's longest queue name (its tables are q_<name>, a_<name>).
const maxQueueName = 47

// Insert batches: a batch is sent when it holds batchRows rows or batchBytes
// of JSON, whichever comes first.
const (
	batchRows  = 1000
	batchBytes = 8 << 20
)

// Info is what validating a capture file found.
type Info struct {
	Header  Header
	Records int
	Bytes   int64 // decompressed
}

// captureReader reads a capture file line by line, validating as it goes.
type captureReader struct {
	lim     Limits
	zr      *gzip.Reader
	count   *countingReader
	sc      *bufio.Scanner
	line    int
	header  Header
	records int
	phase   int             // order of the sections: pgflow tables, queues, messages
	queues  map[string]bool // lower(queue_name) of the queue records seen
	ended   bool
	// copyTables: the tables of the header with columns (version 2).
	copyTables map[string]bool
	// rows counts the records of each table so far, to name a row.
	rows map[string]int
}

// invalidUTF8 is the offset in a JSON line of the first byte that is not
// UTF-8, or of the first \u escape of a lone UTF-16 surrogate, or -1 when
// there is neither. encoding/json decodes both to U+FFFD without an error.
// Backslashes only occur inside JSON strings, so the escapes can be read
// in one pass over the whole line.
func invalidUTF8(b []byte) int {
	if !utf8.Valid(b) {
		for i := 0; i < len(b); {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				return i
			}
			i += n
		}
	}
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+1 < len(b) && b[i+1] != 'u' {
			i++ // \", \\, \n ...: skip the escaped character
			continue
		}
		r, ok := hex4(b, i+2)
		switch {
		case !ok:
			return -1 // not JSON: the decoder has refused the line already
		case utf16.IsSurrogate(r):
			if r < 0xdc00 && i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
				if lo, ok := hex4(b, i+8); ok && lo >= 0xdc00 && lo < 0xe000 {
					i += 11
					continue
				}
			}
			return i
		}
		i += 5
	}
	return -1
}

// hex4 reads the four hex digits of a \u escape at b[at:].
func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// escapeNote says what sits at b[at] when it is an escape.
func escapeNote(b []byte, at int) string {
	if b[at] == '\\' && at+6 <= len(b) {
		return fmt.Sprintf(": %s, half of a UTF-16 surrogate pair", b[at:at+6])
	}
	return fmt.Sprintf(": 0x%02x", b[at])
}

// countingReader counts the decompressed bytes and stops at the limit.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		return n, fmt.Errorf("%w: more than %d bytes decompressed (limit MaxBytes %s)", ErrCaptureLimit, c.limit, sizeText(c.limit))
	}
	return n, err
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadCapture, fmt.Sprintf(format, args...))
}

// limitErr wraps ErrCaptureLimit and ErrBadCapture.
func limitErr(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrBadCapture, ErrCaptureLimit, fmt.Sprintf(format, args...))
}

// newCaptureReader opens r and reads the header.
func newCaptureReader(r io.Reader, lim Limits) (*captureReader, error) {
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, bad("not gzip-compressed (%v)", err)
	}
	cr := &captureReader{lim: lim, zr: zr, queues: map[string]bool{}}
	cr.count = &countingReader{r: zr, limit: lim.MaxBytes}
	cr.sc = bufio.NewScanner(cr.count)
	cr.sc.Buffer(make([]byte, 64<<10), lim.MaxLineBytes+1) // +1: the newline
	if !cr.scan() {
		if err := cr.err(); err != nil {
			return nil, err
		}
		return nil, bad("empty")
	}
	if err := json.Unmarshal(cr.sc.Bytes(), &cr.header); err != nil {
		return nil, bad("line 1 is not a JSON header (%v)", err)
	}
	if at := invalidUTF8(cr.sc.Bytes()); at >= 0 {
		return nil, bad("line 1 (the header) holds text that is not valid UTF-8 (byte %d of the line%s)", at+1, escapeNote(cr.sc.Bytes(), at))
	}
	if cr.header.Format != Format {
		return nil, bad("format %q, want %q", cr.header.Format, Format)
	}
	switch cr.header.Version {
	case 1:
	case 2:
		if len(cr.header.Schemas) == 0 || cr.header.Schemas[0] != "pgflow" {
			return nil, bad("version 2 header without its schemas (pgflow first)")
		}
		for _, sc := range cr.header.Schemas[1:] {
			if reservedSchemas[sc] || sc == "" {
				return nil, bad("version 2 header names schema %q among the captured ones", sc)
			}
		}
		if r := cr.header.Release; r != nil {
			if n := len(versions.UpstreamFiles()); r.Files < 1 || r.Files > n || r.LedgerFiles < -1 || r.LedgerFiles > n {
				return nil, bad("version 2 header names release %q at %d files (ledger %d): upstream's history has 1 to %d", r.Name, r.Files, r.LedgerFiles, n)
			}
		}
	default:
		return nil, bad("version %d, this tool reads versions 1 and %d", cr.header.Version, Version)
	}
	return cr, nil
}

func (cr *captureReader) scan() bool {
	ok := cr.sc.Scan()
	if ok {
		cr.line++
	}
	return ok
}

// err is the scanner's error, as a capture error.
func (cr *captureReader) err() error {
	err := cr.sc.Err()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrCaptureLimit):
		return fmt.Errorf("%w: %w", ErrBadCapture, err)
	case errors.Is(err, bufio.ErrTooLong):
		return limitErr("line %d is longer than %s (limit MaxLineBytes)", cr.line+1, sizeText(int64(cr.lim.MaxLineBytes)))
	default:
		return bad("reading: %v", err)
	}
}

// next returns the next record; ok is false after the end record, which it
// checks (a file must end with it, with the right count, and nothing after).
func (cr *captureReader) next() (rec Record, ok bool, err error) {
	for cr.scan() {
		b := cr.sc.Bytes()
		if cr.ended {
			return rec, false, bad("line %d: data after the end record", cr.line)
		}
		var t trailer
		if err := json.Unmarshal(b, &t); err == nil && t.End != nil {
			if t.End.Records != cr.records {
				return rec, false, bad("the end record says %d records, the file has %d", t.End.Records, cr.records)
			}
			cr.ended = true
			continue
		}
		rec = Record{}
		if err := json.Unmarshal(b, &rec); err != nil {
			return rec, false, bad("line %d: %v", cr.line, err)
		}
		if rec.Table != "" {
			if cr.rows == nil {
				cr.rows = map[string]int{}
			}
			cr.rows[rec.Table]++
		}
		if at := invalidUTF8(b); at >= 0 {
			// The JSON decoder would have put U+FFFD in place of these
			// bytes: the restore would run on text that is not the
			// captured text.
			what := "the " + kindOf(rec) + " record"
			if rec.Table != "" {
				what = fmt.Sprintf("row %d of %s", cr.rows[rec.Table], rec.Table)
			}
			return rec, false, bad("line %d: %s holds text that is not valid UTF-8 (byte %d of the line%s): "+
				"a replay would rehearse on other text than the captured one", cr.line, what, at+1, escapeNote(b, at))
		}
		if err := cr.check(rec); err != nil {
			return rec, false, err
		}
		cr.records++
		if cr.records > cr.lim.MaxRecords {
			return rec, false, limitErr("more than %d records (limit MaxRecords)", cr.lim.MaxRecords)
		}
		return rec, true, nil
	}
	if err := cr.err(); err != nil {
		return rec, false, err
	}
	if !cr.ended {
		return rec, false, bad("no end record: the file is truncated")
	}
	return rec, false, nil
}

// check validates one record: a known table, an object row, and the order
// Write writes (version 1: pgflow tables in foreign key order, then the
// queues, then the messages of declared queues; version 2: pre DDL, rows,
// queues, messages, sequences, post DDL), which lets a restore stream.
func (cr *captureReader) check(rec Record) error {
	var phase int
	var err error
	if cr.header.Version == 1 {
		if rec.DDL != "" || rec.Seq != nil || rec.Section != "" || rec.Copy != nil {
			return bad("line %d: a DDL or sequence record in a version 1 file", cr.line)
		}
		phase, err = cr.phaseV1(rec)
	} else {
		phase, err = cr.phaseV2(rec)
	}
	if err != nil {
		return err
	}
	if phase < cr.phase {
		return bad("line %d: a %s record after later sections (the file is not in the order capture writes)", cr.line, kindOf(rec))
	}
	cr.phase = phase
	return nil
}

func kindOf(rec Record) string {
	switch {
	case rec.DDL != "":
		return rec.Section + " DDL"
	case rec.Seq != nil:
		return "sequence"
	}
	return rec.Table
}

// queueRecord validates a pgmq.queue or message record (both versions).
func (cr *captureReader) queueRecord(rec Record) error {
	switch rec.Table {
	case "pgmq.queue":
		var q struct {
			Name string `json:"queue_name"`
		}
		if err := json.Unmarshal(rec.Row, &q); err != nil || q.Name == "" || len(q.Name) > maxQueueName {
			return bad("line %d: a queue record without a valid queue_name (1 to %d characters)", cr.line, maxQueueName)
		}
		if !cr.queues[strings.ToLower(q.Name)] {
			cr.queues[strings.ToLower(q.Name)] = true
			if len(cr.queues) > cr.lim.MaxQueues {
				return limitErr("more than %d queues (limit MaxQueues)", cr.lim.MaxQueues)
			}
		}
	default: // pgmq.q, pgmq.a
		if rec.Queue == "" {
			return bad("line %d: a queue message without its queue", cr.line)
		}
		if !cr.queues[strings.ToLower(rec.Queue)] {
			return bad("line %d: a message of queue %q, which no queue record before it declares", cr.line, rec.Queue)
		}
	}
	return nil
}

func (cr *captureReader) phaseV1(rec Record) (int, error) {
	if !validTable(rec.Table) || len(rec.Row) == 0 || rec.Row[0] != '{' {
		return 0, bad("line %d: unknown table %q or a row that is not an object", cr.line, rec.Table)
	}
	switch rec.Table {
	case "pgmq.queue":
		return len(captureTables), cr.queueRecord(rec)
	case "pgmq.q", "pgmq.a":
		return len(captureTables) + 1, cr.queueRecord(rec)
	}
	for i, t := range captureTables {
		if rec.Table == "pgflow."+t {
			return i, nil
		}
	}
	return 0, nil
}

// Version 2 sections, in file order.
const (
	v2Pre = iota
	v2Rows
	v2Queues
	v2Messages
	v2Sequences
	v2Post
)

func (cr *captureReader) phaseV2(rec Record) (int, error) {
	switch {
	case rec.DDL != "":
		if rec.Table != "" || rec.Row != nil || rec.Seq != nil {
			return 0, bad("line %d: a DDL record with other fields", cr.line)
		}
		switch rec.Section {
		case "pre":
			return v2Pre, nil
		case "post":
			return v2Post, nil
		}
		return 0, bad("line %d: a DDL record of section %q (want pre or post)", cr.line, rec.Section)
	case rec.Seq != nil:
		if rec.Table != "" || rec.Row != nil || rec.Section != "" {
			return 0, bad("line %d: a sequence record with other fields", cr.line)
		}
		if (rec.Seq.Sequence == "") == (rec.Seq.Table == "" || rec.Seq.Column == "") {
			return 0, bad("line %d: a sequence record naming neither a sequence nor a table's column", cr.line)
		}
		return v2Sequences, nil
	}
	if rec.Section != "" {
		return 0, bad("line %d: a row record with a section", cr.line)
	}
	switch rec.Table {
	case "pgmq.queue", "pgmq.q", "pgmq.a":
		if rec.Copy != nil || len(rec.Row) == 0 || rec.Row[0] != '{' {
			return 0, bad("line %d: a %s record whose row is not a JSON object", cr.line, rec.Table)
		}
		if rec.Table == "pgmq.queue" {
			return v2Queues, cr.queueRecord(rec)
		}
		return v2Messages, cr.queueRecord(rec)
	}
	if rec.Copy == nil || rec.Row != nil || !validCopyLine(*rec.Copy) {
		return 0, bad("line %d: a row of %q that is not one line of COPY text", cr.line, rec.Table)
	}
	if cr.copyTables == nil {
		cr.copyTables = map[string]bool{}
		for _, t := range cr.header.Tables {
			if s, _, _ := strings.Cut(t.Table, "."); s != "pgmq" && len(t.Columns) > 0 {
				cr.copyTables[t.Table] = true
			}
		}
	}
	schema, _, _ := strings.Cut(rec.Table, ".")
	if cr.copyTables[rec.Table] && schema != "pgmq" {
		for _, s := range cr.header.Schemas {
			if s == schema {
				return v2Rows, nil
			}
		}
	}
	return 0, bad("line %d: a row of %q, which the header does not list among the captured schemas' tables", cr.line, rec.Table)
}

// Validate reads a whole capture file and checks it (format, order,
// trailer, limits) without keeping its records. Every problem wraps
// ErrBadCapture; a limit also wraps ErrCaptureLimit.
func Validate(r io.Reader, lim Limits) (*Info, error) {
	cr, err := newCaptureReader(r, lim)
	if err != nil {
		return nil, err
	}
	for {
		_, ok, err := cr.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return &Info{Header: cr.header, Records: cr.records, Bytes: cr.count.n}, nil
		}
	}
}

// Captured is a capture file read into memory (tests and small files;
// `fixtures replay --from` streams with Validate and RestoreFile).
type Captured struct {
	Header  Header
	Records []Record
}

// Read reads and validates a capture file into memory, within
// DefaultLimits. Every problem with the file itself wraps ErrBadCapture.
func Read(r io.Reader) (*Captured, error) {
	cr, err := newCaptureReader(r, DefaultLimits)
	if err != nil {
		return nil, err
	}
	c := &Captured{Header: cr.header}
	for {
		rec, ok, err := cr.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return c, nil
		}
		c.Records = append(c.Records, rec)
	}
}

func validTable(t string) bool {
	switch t {
	case "pgmq.queue", "pgmq.q", "pgmq.a":
		return true
	}
	for _, c := range captureTables {
		if t == "pgflow."+c {
			return true
		}
	}
	return false
}

// ErrNotBaseline: a version 1 capture whose database is not pgflow 0.16.0
// (version 1 files are restored into this tool's own 0.16.0 schema).
var ErrNotBaseline = errors.New("the captured database is not a pgflow 0.16.0 baseline")

// ErrNoPlan: no upgrade plan starts from the captured state (an unknown
// schema, an online upgrade of ours in progress, upstream's newest
// release or a newer one): there is nothing to rehearse.
var ErrNoPlan = errors.New("no upgrade plan starts from the captured state")

// PlanStart is how many of upstream's files the captured database held:
// where a rehearsal of apply's plan starts. It refuses, saying why and what
// to do, a capture no plan starts from: a version 1 file not at 0.16.0
// (ErrNotBaseline); a version 2 file at upstream's newest release; one
// written before captures recorded their release (Header.Release) whose
// state is not 0.16.0's (ErrNoPlan).
func (h Header) PlanStart() (int, error) {
	baseline, err := versions.LookupRelease(versions.R0_16_0)
	if err != nil {
		return 0, err
	}
	newest := len(versions.UpstreamFiles())
	switch {
	case h.Version < 2 && h.PgflowState != string(versions.SchemaBaseline):
		return 0, fmt.Errorf("%w (state %q): a version 1 capture is replayed into this tool's own 0.16.0 schema; capture the database again with this pgflow-upgrade (`fixtures capture`), which records any release a plan starts from",
			ErrNotBaseline, h.PgflowState)
	case h.Version < 2:
		return baseline.Files, nil
	case h.Release != nil && h.Release.Files >= newest:
		return 0, fmt.Errorf("%w: the captured database is at %s, upstream's newest release: nothing to rehearse", ErrNoPlan, h.Release.Name)
	case h.Release != nil:
		return h.Release.Files, nil
	case h.PgflowState == string(versions.SchemaBaseline):
		return baseline.Files, nil
	}
	return 0, fmt.Errorf("%w (state %q, pgflow %q), and the file records no release (an older pgflow-upgrade wrote it): capture the database again with this pgflow-upgrade, which records where it stands on upstream's releases, when it is one a plan starts from",
		ErrNoPlan, h.PgflowState, h.PgflowVersion)
}

// Restore loads a capture into an empty database, in one transaction: a
// version 2 file as its source's catalog said (restoreExact), a version 1
// file into pgmq and this tool's own 0.16.0 engine, then its queues and
// rows. A capture no plan starts from is refused (Header.PlanStart).
func (c *Captured) Restore(ctx context.Context, conn *pgx.Conn) error {
	i := 0
	return restore(ctx, conn, c.Header, func() (Record, bool, error) {
		if i == len(c.Records) {
			return Record{}, false, nil
		}
		i++
		return c.Records[i-1], true, nil
	})
}

// RestoreFile loads the capture file at path into an empty database as
// Restore does, reading the file as a stream (it validates it again as it
// goes: the file may have changed since Validate).
func RestoreFile(ctx context.Context, conn *pgx.Conn, path string, lim Limits) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer f.Close()
	cr, err := newCaptureReader(bufio.NewReaderSize(f, 1<<20), lim)
	if err != nil {
		return err
	}
	return restore(ctx, conn, cr.header, cr.next)
}

// restore inserts the records next yields, in their order (the order
// Write writes, which the reader enforces), in batches.
func restore(ctx context.Context, conn *pgx.Conn, h Header, next func() (Record, bool, error)) error {
	if _, err := h.PlanStart(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if h.Version >= 2 {
		return restoreExact(ctx, conn, h, next)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := fixtures.InstallEngine(ctx, tx); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	b := &batch{tx: tx}
	var queues []string // physical (lower-case) names, in order
	seen := map[string]bool{}
	for {
		r, ok, err := next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if r.Table == "pgmq.queue" {
			if err := b.flush(ctx); err != nil {
				return err
			}
			phys, err := restoreQueue(ctx, tx, r.Row)
			if err != nil {
				return err
			}
			if !seen[phys] {
				seen[phys] = true
				queues = append(queues, phys)
			}
			continue
		}
		if err := b.add(ctx, insertTarget(r), r.Row); err != nil {
			return err
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	// Each queue's identity sequence continues past every id the queue ever
	// handed out that we can see: live and archived messages, and the ids
	// tasks remember (a pruned message leaves its id in step_tasks).
	for _, phys := range queues {
		live := pgx.Identifier{"pgmq", "q_" + phys}.Sanitize()
		archive := pgx.Identifier{"pgmq", "a_" + phys}.Sanitize()
		sql := "select pg_catalog.setval(pg_catalog.pg_get_serial_sequence($1, 'msg_id'), greatest(" +
			"(select pg_catalog.max(msg_id) from " + live + "), (select pg_catalog.max(msg_id) from " + archive + "), " +
			"(select pg_catalog.max(t.message_id) from pgflow.step_tasks t where pg_catalog.lower(t.flow_slug) = $2), 0) + 1, false)"
		if _, err := tx.Exec(ctx, sql, "pgmq.q_"+phys, phys); err != nil {
			return fmt.Errorf("restore: advancing the message id sequence of %s: %w", live, err)
		}
	}
	return tx.Commit(ctx)
}

// restoreQueue creates the queue of a pgmq.queue record and returns its
// physical (lower-case) name.
func restoreQueue(ctx context.Context, tx pgx.Tx, row json.RawMessage) (string, error) {
	var q struct {
		Name        string `json:"queue_name"`
		Partitioned bool   `json:"is_partitioned"`
		Unlogged    bool   `json:"is_unlogged"`
	}
	if err := json.Unmarshal(row, &q); err != nil || q.Name == "" {
		return "", fmt.Errorf("%w: a queue record without a name", ErrBadCapture)
	}
	if q.Partitioned {
		return "", fmt.Errorf("restore: queue %q is partitioned (pg_partman); replay does not support partitioned queues", q.Name)
	}
	fn := "pgmq.create"
	if q.Unlogged {
		fn = "pgmq.create_unlogged"
	}
	if _, err := tx.Exec(ctx, "select "+fn+"($1)", q.Name); err != nil {
		return "", fmt.Errorf("restore: creating queue %q: %w", q.Name, err)
	}
	if _, err := tx.Exec(ctx, `update pgmq.meta set created_at = ($2::pg_catalog.jsonb operator(pg_catalog.->>) 'created_at')::pg_catalog.timestamptz where queue_name operator(pg_catalog.=) $1`, q.Name, string(row)); err != nil {
		return "", fmt.Errorf("restore: queue %q: %w", q.Name, err)
	}
	return strings.ToLower(q.Name), nil
}

// insertTarget is the table a record's row goes into, with the clause its
// insert needs (queue tables have an identity column).
func insertTarget(r Record) string {
	switch r.Table {
	case "pgmq.q":
		return pgx.Identifier{"pgmq", "q_" + strings.ToLower(r.Queue)}.Sanitize() + " overriding system value"
	case "pgmq.a":
		return pgx.Identifier{"pgmq", "a_" + strings.ToLower(r.Queue)}.Sanitize()
	default:
		s, t, _ := strings.Cut(r.Table, ".")
		return pgx.Identifier{s, t}.Sanitize()
	}
}

// batch collects rows of one target as a JSON array and inserts them with
// one statement per batchRows rows or batchBytes bytes.
type batch struct {
	tx     pgx.Tx
	target string
	buf    bytes.Buffer
	rows   int
	// columns: per table, the head of its insert (version 2); nil for
	// version 1 files.
	columns map[string]string
}

func (b *batch) add(ctx context.Context, target string, row json.RawMessage) error {
	if target != b.target {
		if err := b.flush(ctx); err != nil {
			return err
		}
		b.target = target
	}
	if b.rows == 0 {
		b.buf.WriteByte('[')
	} else {
		b.buf.WriteByte(',')
	}
	b.buf.Write(row)
	b.rows++
	if b.rows >= batchRows || b.buf.Len() >= batchBytes {
		return b.flush(ctx)
	}
	return nil
}

func (b *batch) flush(ctx context.Context) error {
	if b.rows == 0 {
		return nil
	}
	b.buf.WriteByte(']')
	table, sql, err := b.insertSQL(ctx)
	if err == nil {
		_, err = b.tx.Exec(ctx, sql, b.buf.Bytes())
	}
	b.buf.Reset()
	b.rows = 0
	if err != nil {
		return fmt.Errorf("restore: inserting into %s: %w", table, err)
	}
	return nil
}
