package scenario

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

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// The capture file (docs/fixtures.md "Capture file format"): gzip-compressed
// JSON lines. Line 1 is the Header; then one Record per line; the last line
// is the trailer {"end": {"records": N}} so a truncated file is detected.

// CaptureFormat and CaptureVersion identify the file.
const (
	CaptureFormat  = "pgflow-upgrade-capture"
	CaptureVersion = 1
)

// Header is the first line of a capture file.
type Header struct {
	Format      string    `json:"format"`
	Version     int       `json:"version"`
	PgflowState string    `json:"pgflow_state"` // audit schema state: "baseline" for pgflow 0.16.0
	CreatedAt   time.Time `json:"created_at"`
	Redacted    bool      `json:"redacted"`
	Source      string    `json:"source,omitempty"` // host/database, never a password
}

// Record is one line after the header: a pgflow row, a queue, or a queue or
// archive message.
type Record struct {
	// Table is "pgflow.<table>", "pgmq.queue" (a row of pgmq.list_queues()),
	// "pgmq.q" or "pgmq.a" (a message of queue Queue, live or archived).
	Table string          `json:"table"`
	Queue string          `json:"queue,omitempty"`
	Row   json.RawMessage `json:"row"`
}

type trailer struct {
	End *struct {
		Records int `json:"records"`
	} `json:"end"`
}

// captureTables are the pgflow tables in restore (foreign key) order.
var captureTables = []string{"flows", "steps", "deps", "workers", "worker_functions", "runs", "step_states", "step_tasks"}

// ErrBadCapture is wrapped by every error about a damaged or foreign file.
var ErrBadCapture = errors.New("not a usable pgflow-upgrade capture file")

// CaptureOptions configure Capture.
type CaptureOptions struct {
	// Redact replaces runs.input and the outputs of step_states and
	// step_tasks (and runs.output) with placeholders that keep their shape
	// where the engine depends on it: an array keeps its length (a map step
	// fans out over it), every other value becomes "<redacted>".
	Redact bool
	Source string
}

// Redacted is the placeholder value.
const Redacted = "<redacted>"

// Capture writes the pgflow state of conn's database, pgmq queues and their
// live and archived messages included (pg_dump leaves those out), in one
// REPEATABLE READ, READ ONLY snapshot. It returns the number of records.
func Capture(ctx context.Context, conn *pgx.Conn, w io.Writer, opts CaptureOptions) (int, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("capture: opening a read-only snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "set local timezone to 'UTC'"); err != nil {
		return 0, fmt.Errorf("capture: %w", err)
	}
	info, err := upgrade.DetectState(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("capture: detecting the pgflow schema: %w", err)
	}
	if !info.HasTables {
		return 0, fmt.Errorf("capture: the database has no pgflow tables (state %s)", info.State)
	}
	zw := gzip.NewWriter(w)
	bw := bufio.NewWriter(zw)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	h := Header{Format: CaptureFormat, Version: CaptureVersion, PgflowState: string(info.State),
		CreatedAt: time.Now().UTC().Truncate(time.Second), Redacted: opts.Redact, Source: opts.Source}
	if err := enc.Encode(h); err != nil {
		return 0, err
	}
	n := 0
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
			if opts.Redact {
				if raw, err = redact(table, raw); err != nil {
					return err
				}
			}
			if err := enc.Encode(Record{Table: table, Queue: queue, Row: raw}); err != nil {
				return err
			}
			n++
		}
		return rows.Err()
	}
	for _, t := range captureTables {
		var exists bool
		if err := tx.QueryRow(ctx, `select pg_catalog.to_regclass($1) is not null`, "pgflow."+t).Scan(&exists); err != nil {
			return n, fmt.Errorf("capture: %w", err)
		}
		if !exists {
			continue
		}
		if err := emit("pgflow."+t, "", "select to_jsonb(t) from "+pgx.Identifier{"pgflow", t}.Sanitize()+" t"); err != nil {
			return n, err
		}
	}
	queues, err := queueNames(ctx, tx)
	if err != nil {
		return n, err
	}
	if err := emit("pgmq.queue", "", `select to_jsonb(q) from pgmq.list_queues() q order by q.queue_name`); err != nil {
		return n, err
	}
	// Case-only aliases share one physical table: write its rows once.
	seen := map[string]bool{}
	for _, q := range queues {
		phys := strings.ToLower(q)
		if seen[phys] {
			continue
		}
		seen[phys] = true
		for _, kind := range []string{"q", "a"} {
			sql := "select to_jsonb(m) from " + pgx.Identifier{"pgmq", kind + "_" + phys}.Sanitize() + " m order by m.msg_id"
			if err := emit("pgmq."+kind, q, sql); err != nil {
				return n, err
			}
		}
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

// redact replaces the user data of one row.
func redact(table string, raw []byte) ([]byte, error) {
	var cols []string
	switch table {
	case "pgflow.runs":
		cols = []string{"input", "output"}
	case "pgflow.step_states", "pgflow.step_tasks":
		cols = []string{"output"}
	default:
		return raw, nil
	}
	var row map[string]json.RawMessage
	if err := json.Unmarshal(raw, &row); err != nil {
		return nil, fmt.Errorf("capture: redacting %s: %w", table, err)
	}
	for _, c := range cols {
		v, ok := row[c]
		if !ok || string(v) == "null" {
			continue
		}
		row[c] = placeholder(v)
	}
	return marshalPlain(row)
}

// marshalPlain is json.Marshal without HTML escaping ("<redacted>" stays readable).
func marshalPlain(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimRight(b.String(), "\n")), nil
}

func placeholder(v json.RawMessage) json.RawMessage {
	var arr []json.RawMessage
	if json.Unmarshal(v, &arr) == nil {
		out := make([]string, len(arr))
		for i := range out {
			out[i] = Redacted
		}
		b, _ := marshalPlain(out)
		return b
	}
	b, _ := marshalPlain(Redacted)
	return b
}

// Captured is a capture file read into memory.
type Captured struct {
	Header  Header
	Records []Record
}

// ReadCapture reads and validates a capture file. Every problem with the file
// itself wraps ErrBadCapture.
func ReadCapture(r io.Reader) (*Captured, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadCapture, fmt.Sprintf(format, args...))
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, bad("not gzip-compressed (%v)", err)
	}
	defer zr.Close()
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	c := &Captured{}
	line := 0
	ended := false
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if line == 1 {
			if err := json.Unmarshal(b, &c.Header); err != nil {
				return nil, bad("line 1 is not a JSON header (%v)", err)
			}
			if c.Header.Format != CaptureFormat {
				return nil, bad("format %q, want %q", c.Header.Format, CaptureFormat)
			}
			if c.Header.Version != CaptureVersion {
				return nil, bad("version %d, this tool reads version %d", c.Header.Version, CaptureVersion)
			}
			continue
		}
		if ended {
			return nil, bad("line %d: data after the end record", line)
		}
		var t trailer
		if err := json.Unmarshal(b, &t); err == nil && t.End != nil {
			if t.End.Records != len(c.Records) {
				return nil, bad("the end record says %d records, the file has %d", t.End.Records, len(c.Records))
			}
			ended = true
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, bad("line %d: %v", line, err)
		}
		if !validTable(rec.Table) || len(rec.Row) == 0 || rec.Row[0] != '{' {
			return nil, bad("line %d: unknown table %q or a row that is not an object", line, rec.Table)
		}
		if (rec.Table == "pgmq.q" || rec.Table == "pgmq.a") && rec.Queue == "" {
			return nil, bad("line %d: a queue message without its queue", line)
		}
		c.Records = append(c.Records, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, bad("reading: %v", err)
	}
	if line == 0 {
		return nil, bad("empty")
	}
	if !ended {
		return nil, bad("no end record: the file is truncated")
	}
	return c, nil
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

// ErrNotBaseline: the captured database is not pgflow 0.16.0, so there is no
// upgrade to replay.
var ErrNotBaseline = errors.New("the captured database is not a pgflow 0.16.0 baseline")

// Restore loads a capture into an empty database: pgmq and the 0.16.0
// engine, then the queues, then every row, in one transaction.
func (c *Captured) Restore(ctx context.Context, conn *pgx.Conn) error {
	if c.Header.PgflowState != string(audit.StateBaseline) {
		return fmt.Errorf("%w (state %q): nothing to replay", ErrNotBaseline, c.Header.PgflowState)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := fixtures.InstallEngine(ctx, tx); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	// Queues first (create_flow would make them; rows are inserted as is).
	for _, r := range c.Records {
		if r.Table != "pgmq.queue" {
			continue
		}
		var q struct {
			Name        string `json:"queue_name"`
			Partitioned bool   `json:"is_partitioned"`
			Unlogged    bool   `json:"is_unlogged"`
		}
		if err := json.Unmarshal(r.Row, &q); err != nil || q.Name == "" {
			return fmt.Errorf("%w: a queue record without a name", ErrBadCapture)
		}
		if q.Partitioned {
			return fmt.Errorf("restore: queue %q is partitioned (pg_partman); replay does not support partitioned queues", q.Name)
		}
		fn := "pgmq.create"
		if q.Unlogged {
			fn = "pgmq.create_unlogged"
		}
		if _, err := tx.Exec(ctx, "select "+fn+"($1)", q.Name); err != nil {
			return fmt.Errorf("restore: creating queue %q: %w", q.Name, err)
		}
		if _, err := tx.Exec(ctx, `update pgmq.meta set created_at = ($2::jsonb ->> 'created_at')::timestamptz where queue_name = $1`, q.Name, string(r.Row)); err != nil {
			return fmt.Errorf("restore: queue %q: %w", q.Name, err)
		}
	}
	batches := map[string][]json.RawMessage{}
	var order []string
	for _, r := range c.Records {
		if r.Table == "pgmq.queue" {
			continue
		}
		key := r.Table
		if r.Queue != "" {
			key += "\x00" + strings.ToLower(r.Queue)
		}
		if _, ok := batches[key]; !ok {
			order = append(order, key)
		}
		batches[key] = append(batches[key], r.Row)
	}
	insert := func(key string) error {
		rows := batches[key]
		table, queue, _ := strings.Cut(key, "\x00")
		var target, extra string
		switch table {
		case "pgmq.q":
			target = pgx.Identifier{"pgmq", "q_" + queue}.Sanitize()
			extra = " overriding system value"
		case "pgmq.a":
			target = pgx.Identifier{"pgmq", "a_" + queue}.Sanitize()
		default:
			s, t, _ := strings.Cut(table, ".")
			target = pgx.Identifier{s, t}.Sanitize()
		}
		for i := 0; i < len(rows); i += 1000 {
			chunk := rows[i:min(i+1000, len(rows))]
			b, err := json.Marshal(chunk)
			if err != nil {
				return err
			}
			sql := "insert into " + target + extra + " select * from jsonb_populate_recordset(null::" + target + ", $1::jsonb)"
			if _, err := tx.Exec(ctx, sql, string(b)); err != nil {
				return fmt.Errorf("restore: inserting into %s: %w", target, err)
			}
		}
		return nil
	}
	// pgflow tables in foreign key order, then the messages.
	for _, t := range captureTables {
		if _, ok := batches["pgflow."+t]; ok {
			if err := insert("pgflow." + t); err != nil {
				return err
			}
		}
	}
	for _, key := range order {
		if strings.HasPrefix(key, "pgmq.") {
			if err := insert(key); err != nil {
				return err
			}
		}
	}
	// Each queue's identity sequence continues past every id the queue ever
	// handed out that we can see: live and archived messages, and the ids
	// tasks remember (a pruned message leaves its id in step_tasks).
	done := map[string]bool{}
	for _, r := range c.Records {
		if r.Table != "pgmq.queue" {
			continue
		}
		var q struct {
			Name string `json:"queue_name"`
		}
		_ = json.Unmarshal(r.Row, &q)
		phys := strings.ToLower(q.Name)
		if done[phys] {
			continue
		}
		done[phys] = true
		live := pgx.Identifier{"pgmq", "q_" + phys}.Sanitize()
		archive := pgx.Identifier{"pgmq", "a_" + phys}.Sanitize()
		sql := "select setval(pg_catalog.pg_get_serial_sequence($1, 'msg_id'), greatest(" +
			"(select max(msg_id) from " + live + "), (select max(msg_id) from " + archive + "), " +
			"(select max(t.message_id) from pgflow.step_tasks t where lower(t.flow_slug) = $2), 0) + 1, false)"
		if _, err := tx.Exec(ctx, sql, "pgmq.q_"+phys, phys); err != nil {
			return fmt.Errorf("restore: advancing the message id sequence of %s: %w", live, err)
		}
	}
	return tx.Commit(ctx)
}

// CaptureScenarios replay the upgrade and its invariants on a captured
// state (every scenario's database is a clone of the restored capture).
func CaptureScenarios() []Scenario {
	return []Scenario{
		{Name: "capture-upgrade-survives", Run: captureSurvives,
			Proves: "the captured database upgrades: every row, queue and message identical, queue_name right, verify passes"},
		{Name: "capture-old-worker-fenced", Run: captureFenced,
			Proves: "after the upgrade of the captured database a 0.16.0 worker's claim, start_tasks(flow_slug =>, msg_ids =>, worker_id =>), fails with 42883 and claims nothing"},
		{Name: "capture-new-worker-drains", Run: captureDrains,
			Proves: "after the upgrade of the captured database the new worker drains every in-flight run that can finish"},
	}
}

func captureSurvives(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	before, err := survive(ctx, env, db)
	if err != nil {
		return err
	}
	if err := verifyUpgraded(ctx, db); err != nil {
		return err
	}
	env.Notef("%d rows and messages identical", before.RowCount())
	return nil
}

func captureFenced(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	state := `select count(*) filter (where status = 'started') || '/' || coalesce(sum(attempts_count), 0) from pgflow.step_tasks`
	var before, after string
	if err := db.Pool.QueryRow(ctx, state).Scan(&before); err != nil {
		return err
	}
	// A 0.16.0 worker's claim, with every message id of the captured tasks.
	_, callErr := db.Pool.Exec(ctx, `select * from pgflow.start_tasks(flow_slug => (select min(flow_slug) from pgflow.flows),
		msg_ids => array(select message_id from pgflow.step_tasks where message_id is not null),
		worker_id => '00000000-0000-0000-0000-000000000000'::uuid)`)
	if code := pgCode(callErr); code != undefinedFunction {
		return fmt.Errorf("a 0.16.0 start_tasks call after the upgrade: SQLSTATE %q, want %s (%v)", code, undefinedFunction, callErr)
	}
	if err := db.Pool.QueryRow(ctx, state).Scan(&after); err != nil {
		return err
	}
	if after != before {
		return errorf("the rejected claim changed tasks (started/attempts %s -> %s)", before, after)
	}
	return nil
}

func captureDrains(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	open, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	rep, err := Drain(ctx, db, DrainOptions{FastForward: true, Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	still, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if still != len(rep.Stuck) {
		return errorf("%d runs still started after the drain (%d stuck by design)", still, len(rep.Stuck))
	}
	env.Notef("%d in-flight runs, %d tasks completed, %d stuck by design (permanently stalled)", open, rep.Completed, len(rep.Stuck))
	return nil
}
