package cli_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestReplayRefusesCaptureWithInvalidUTF8: a capture whose text is not
// UTF-8 (a byte 0xff in a run's input, or a JSON escape of half a UTF-16
// surrogate pair) is refused before any database is made, exit 2, naming
// the table and the row; the JSON decoder would otherwise have replaced the
// text with U+FFFD and the replay have passed on data that is not the
// captured data. A full pair (an emoji) is valid text and is accepted.
func TestReplayRefusesCaptureWithInvalidUTF8(t *testing.T) {
	db := testdb.Baseline(t)
	sqlExec(t, db,
		`select pgflow.create_flow('utf')`,
		`select pgflow.add_step('utf', 'a')`,
		`select pgflow.start_flow('utf', '{"note": "utf8-marker"}'::jsonb)`)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl.gz")
	if r := run(t, map[string]string{}, "--dsn", db.DSN, "fixtures", "capture", "--out", good); r.code != cli.ExitOK {
		t.Fatalf("capture: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	plain := gunzipFile(t, good)
	if !bytes.Contains(plain, []byte("utf8-marker")) {
		t.Fatal("the capture does not hold the run's input")
	}
	variant := func(name, replacement string) string {
		p := filepath.Join(dir, name)
		writeGzip(t, p, bytes.Replace(plain, []byte("utf8-marker"), []byte(replacement), 1))
		return p
	}

	// A valid surrogate pair is text: accepted.
	f, err := os.Open(variant("pair.jsonl.gz", `utf8-\ud83d\ude00marker`))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := scenario.ValidateCapture(f, scenario.DefaultLimits); err != nil {
		t.Errorf("a capture with an escaped surrogate pair: %v", err)
	}

	for _, c := range []struct{ name, replacement, what string }{
		{"byte.jsonl.gz", "utf8-\xffmarker", "0xff"},
		{"lone-surrogate.jsonl.gz", `utf8-\udc80marker`, `\udc80`},
		{"high-surrogate-alone.jsonl.gz", `utf8-\ud83dmarker`, `\ud83d`},
	} {
		r := run(t, replayEnv(t), "fixtures", "replay", "--from", variant(c.name, c.replacement))
		t.Logf("%s: exit %d: %s", c.name, r.code, strings.TrimSpace(r.stderr))
		if r.code != cli.ExitUsage {
			t.Errorf("%s: exit %d, want %d\n%s", c.name, r.code, cli.ExitUsage, r.stdout)
		}
		for _, w := range []string{"row 1 of pgflow.runs", "not valid UTF-8", c.what} {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: the error does not say %q", c.name, w)
			}
		}
	}
}

func gunzipFile(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeGzip(t *testing.T, path string, b []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}
