package capture_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func captureOf(t *testing.T, db *testdb.DB, redact bool) []byte {
	t.Helper()
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(context.Background())
	var buf bytes.Buffer
	if _, err := capture.Write(context.Background(), conn, &buf, capture.Options{Redact: redact}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// restored rebuilds c on a new empty throwaway database (Capture.Restore, as
// fixtures replay --from does) and returns that database.
func restored(t *testing.T, c *capture.Captured) *testdb.DB {
	t.Helper()
	ctx := context.Background()
	dst := testdb.Empty(t)
	conn := testdb.Connect(t, dst.DSN)
	defer conn.Close(ctx)
	if err := c.Restore(ctx, conn); err != nil {
		t.Fatal(err)
	}
	return dst
}

// rowDiff is every row and message of src that dst lacks or holds
// otherwise, and every row dst adds; srcRows counts src's rows.
func rowDiff(t *testing.T, src, dst *testdb.DB) (d []fingerprint.Diff, srcRows int) {
	t.Helper()
	a := src.Fingerprint(t)
	b := dst.Fingerprint(t)
	return append(fingerprint.Compare(a, b), fingerprint.Added(a, b)...), a.RowCount()
}

// sameCatalogs fails t for each schema whose catalog in dst differs from
// src's.
func sameCatalogs(t *testing.T, src, dst *testdb.DB, schemas ...string) {
	t.Helper()
	ctx := context.Background()
	for _, schema := range schemas {
		want, err := catalog.Read(ctx, src.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		got, err := catalog.Read(ctx, dst.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		if d := catalog.Diff(want, got); len(d) > 0 {
			t.Errorf("schema %s rebuilt with %d differences:\n%s", schema, len(d), strings.Join(catalog.Strings(d), "\n"))
		}
	}
}

func TestCaptureRoundTrip(t *testing.T) {
	ctx := context.Background()
	src := testdb.Baseline(t)
	if _, err := scenario.Generate(ctx, src.Pool, 3); err != nil {
		t.Fatal(err)
	}
	// A case-only alias shares one physical queue: written once, restored.
	if _, err := src.Pool.Exec(ctx, `select pgflow.create_flow('Gen_alias'); select pgflow.create_flow('gen_alias')`); err != nil {
		t.Fatal(err)
	}
	file := captureOf(t, src, false)
	c, err := capture.Read(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if c.Header.PgflowState != "baseline" || c.Header.Redacted {
		t.Fatalf("header %+v", c.Header)
	}
	dst := restored(t, c)
	if d, _ := rowDiff(t, src, dst); len(d) > 0 {
		t.Fatalf("restored state differs from the source:\n%s", fingerprint.Format(d, 20))
	}
	// Every restored queue keeps allocating ids after every id it handed out
	// (live, archived, or remembered by a task).
	rows, err := src.Pool.Query(ctx, `select queue_name::text from pgmq.list_queues()`)
	if err != nil {
		t.Fatal(err)
	}
	queues, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		phys := strings.ToLower(q)
		var maxSrc, next int64
		if err := src.Pool.QueryRow(ctx, `select greatest(
				(select max(msg_id) from `+pgx.Identifier{"pgmq", "q_" + phys}.Sanitize()+`),
				(select max(msg_id) from `+pgx.Identifier{"pgmq", "a_" + phys}.Sanitize()+`),
				(select max(message_id) from pgflow.step_tasks where lower(flow_slug) = $1), 0)`, phys).Scan(&maxSrc); err != nil {
			t.Fatal(err)
		}
		if err := dst.Pool.QueryRow(ctx, `select * from pgmq.send($1, '{}'::jsonb)`, q).Scan(&next); err != nil {
			t.Fatal(err)
		}
		if next <= maxSrc {
			t.Errorf("queue %s: a new message got id %d, not after the restored ones (max %d)", q, next, maxSrc)
		}
	}
}

func TestCaptureRedacts(t *testing.T) {
	ctx := context.Background()
	src := testdb.Baseline(t)
	if _, err := src.Pool.Exec(ctx, `
		select pgflow.create_flow('red');
		select pgflow.add_step('red', 'items', step_type => 'map');
		select pgflow.add_step('red', 'sum', array['items']);
		select count(*) from pgflow.start_flow('red', '["secret-a", "secret-b"]'::jsonb);
		insert into pgflow.workers (worker_id, queue_name, function_name) values ('00000000-0000-4000-8000-000000000001', 'red', 'f');
		select count(*) from pgflow.start_tasks('red', array(select msg_id from pgmq.read('red', 30, 10)), '00000000-0000-4000-8000-000000000001');
		select count(*) from pgflow.complete_task((select run_id from pgflow.runs), 'items', 0, '{"token": "secret-out"}');`); err != nil {
		t.Fatal(err)
	}
	file := captureOf(t, src, true)
	zr, err := gzip.NewReader(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	var plain bytes.Buffer
	if _, err := plain.ReadFrom(zr); err != nil {
		t.Fatal(err)
	}
	// The DDL names vault's secrets; the user's data is what must be gone.
	if strings.Contains(plain.String(), "secret-a") || strings.Contains(plain.String(), "secret-b") || strings.Contains(plain.String(), "secret-out") {
		t.Fatalf("redacted capture still holds user data:\n%s", plain.String())
	}
	c, err := capture.Read(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Header.Redacted {
		t.Fatal("header does not say redacted")
	}
	found := false
	for _, r := range c.Records {
		if r.Table == "pgflow.runs" && r.Copy != nil && strings.Contains(*r.Copy, `["<redacted>", "<redacted>"]`) {
			found = true
		}
	}
	if !found {
		t.Fatal("the root map input did not keep its length as placeholders")
	}
}

func TestDamagedCaptureIsRefused(t *testing.T) {
	src := testdb.Baseline(t)
	good := captureOf(t, src, false)
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return b.Bytes()
	}
	cases := map[string][]byte{
		"not gzip":       []byte("hello, this is a pg_dump file"),
		"truncated gzip": good[:len(good)/2],
		"empty":          gz(""),
		"foreign json":   gz(`{"some": "other tool"}` + "\n"),
		"future version": gz(`{"format": "pgflow-upgrade-capture", "version": 99}` + "\n"),
		"no end record":  gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline"}` + "\n" + `{"table": "pgflow.flows", "row": {"flow_slug": "x"}}` + "\n"),
		"count mismatch": gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline"}` + "\n" + `{"end": {"records": 3}}` + "\n"),
		"unknown table":  gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline"}` + "\n" + `{"table": "public.users", "row": {}}` + "\n" + `{"end": {"records": 1}}` + "\n"),
		"garbage line":   gz(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline"}` + "\n" + `not json` + "\n"),
	}
	for name, file := range cases {
		_, err := capture.Read(bytes.NewReader(file))
		if !errors.Is(err, capture.ErrBadCapture) {
			t.Errorf("%s: want ErrBadCapture, got %v", name, err)
		}
	}
	if _, err := capture.Read(bytes.NewReader(good)); err != nil {
		t.Fatalf("the good file: %v", err)
	}
}
