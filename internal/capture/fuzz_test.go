package capture_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
)

// The capture file reader is the one parser that reads a file a user hands
// us (`fixtures replay --from FILE`). FuzzReadCapture feeds it fuzzed JSON
// lines (gzip-compressed by the test, so the fuzzer works on the content)
// and fuzzed raw bytes: it never panics, every refusal wraps ErrBadCapture,
// and whatever it accepts is well-formed: the known header, only known
// tables, rows that are JSON objects, queue messages with their queue, and
// the same records when written back and read again.

const fuzzHeader = `{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline", "created_at": "2026-12-02T12:00:00Z"}`

const fuzzHeader2 = `{"format": "pgflow-upgrade-capture", "version": 2, "pgflow_state": "baseline", "created_at": "2026-12-02T12:00:00Z", "schemas": ["pgflow", "app"], "tables": [{"table": "app.jobs", "rows": 1, "bytes": 8192, "columns": ["id"]}]}`

func gzipped(s string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write([]byte(s))
	_ = w.Close()
	return b.Bytes()
}

func FuzzReadCapture(f *testing.F) {
	for _, s := range []string{
		fuzzHeader + "\n" + `{"end": {"records": 0}}` + "\n",
		fuzzHeader + "\n" + `{"table": "pgflow.flows", "row": {"flow_slug": "x"}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"table": "pgmq.q", "queue": "x", "row": {"msg_id": "1"}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"table": "pgmq.a", "row": {"msg_id": "1"}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"table": "public.users", "row": {}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"table": "pgflow.runs", "row": [1, 2]}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"end": {"records": 3}}` + "\n",
		fuzzHeader + "\n" + `{"end": {"records": 0}}` + "\n" + `{"table": "pgflow.flows", "row": {}}` + "\n",
		fuzzHeader + "\n",
		`{"format": "pgflow-upgrade-capture", "version": 99}` + "\n",
		`{"some": "other tool"}` + "\n",
		"",
		"not json\n",
		fuzzHeader2 + "\n" + `{"ddl": "create schema if not exists pgflow", "section": "pre"}` + "\n" + `{"table": "app.jobs", "copy": "1"}` + "\n" +
			`{"seq": {"sequence": "app.s", "last_value": 3, "is_called": true}}` + "\n" + `{"ddl": "create index i on app.jobs (id)", "section": "post"}` + "\n" + `{"end": {"records": 4}}` + "\n",
		fuzzHeader2 + "\n" + `{"ddl": "x", "section": "post"}` + "\n" + `{"ddl": "y", "section": "pre"}` + "\n" + `{"end": {"records": 2}}` + "\n",
		fuzzHeader2 + "\n" + `{"table": "other.t", "copy": "1"}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader2 + "\n" + `{"table": "app.jobs", "copy": "1\n2"}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader2 + "\n" + `{"table": "app.jobs", "row": {"id": 1}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader2 + "\n" + `{"seq": {"last_value": 3}}` + "\n" + `{"end": {"records": 1}}` + "\n",
		fuzzHeader + "\n" + `{"table": "pgflow.flows", "row": {"flow_slug": "it's \"quoted\"; drop table x; --"}}` + "\n" + `{"end": {"records": 1}}` + "\n",
	} {
		f.Add(s, false)
	}
	f.Add("hello, this is a pg_dump file", true)
	f.Add(string(gzipped(fuzzHeader + "\n")[:10]), true)
	f.Fuzz(func(t *testing.T, content string, raw bool) {
		file := []byte(content)
		if !raw {
			file = gzipped(content)
		}
		c, err := capture.Read(bytes.NewReader(file))
		if err != nil {
			if !errors.Is(err, capture.ErrBadCapture) {
				t.Fatalf("refusal does not wrap ErrBadCapture: %v", err)
			}
			if !strings.Contains(err.Error(), "capture") {
				t.Fatalf("refusal does not say what was being read: %v", err)
			}
			return
		}
		if c.Header.Format != capture.Format || (c.Header.Version != 1 && c.Header.Version != capture.Version) {
			t.Fatalf("accepted a foreign header %+v", c.Header)
		}
		schemas := map[string]bool{"pgflow": true, "pgmq": true}
		for _, s := range c.Header.Schemas {
			schemas[s] = true
		}
		var again strings.Builder
		hdr, _ := json.Marshal(c.Header)
		again.Write(hdr)
		again.WriteByte('\n')
		for _, r := range c.Records {
			if r.DDL != "" || r.Seq != nil {
				if c.Header.Version == 1 || r.Table != "" || r.Row != nil {
					t.Fatalf("accepted a DDL or sequence record with a row, or in a version 1 file: %+v", r)
				}
			} else {
				if s, _, _ := strings.Cut(r.Table, "."); !schemas[s] {
					t.Fatalf("accepted a record of table %q (schemas %v)", r.Table, c.Header.Schemas)
				}
				if r.Copy != nil {
					if c.Header.Version == 1 || r.Row != nil || strings.ContainsAny(*r.Copy, "\n\r") || *r.Copy == `\.` {
						t.Fatalf("accepted a COPY row that is not one line of a version 2 file: %+v", r)
					}
				} else if len(r.Row) == 0 || r.Row[0] != '{' || !json.Valid(r.Row) {
					t.Fatalf("accepted a row that is not a JSON object: %q", r.Row)
				}
			}
			if (r.Table == "pgmq.q" || r.Table == "pgmq.a") && r.Queue == "" {
				t.Fatalf("accepted a queue message without its queue: %+v", r)
			}
			b, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("an accepted record does not encode: %v", err)
			}
			again.Write(b)
			again.WriteByte('\n')
		}
		end, _ := json.Marshal(map[string]any{"end": map[string]int{"records": len(c.Records)}})
		again.Write(end)
		again.WriteByte('\n')
		c2, err := capture.Read(bytes.NewReader(gzipped(again.String())))
		if err != nil {
			t.Fatalf("written back, an accepted file is refused: %v", err)
		}
		if len(c2.Records) != len(c.Records) {
			t.Fatalf("round trip: %d records, want %d", len(c2.Records), len(c.Records))
		}
		for i := range c.Records {
			if c.Records[i].Table != c2.Records[i].Table || c.Records[i].Queue != c2.Records[i].Queue {
				t.Fatalf("round trip: record %d is %+v, want %+v", i, c2.Records[i], c.Records[i])
			}
		}
	})
}
