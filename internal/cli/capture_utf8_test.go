package cli_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
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
	db.Exec(t,
		`select pgflow.create_flow('utf')`,
		`select pgflow.add_step('utf', 'a')`,
		`select pgflow.start_flow('utf', '{"note": "utf8-marker"}'::jsonb)`)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl.gz")
	if r := clitest.Run(t, map[string]string{}, "--dsn", db.DSN, "fixtures", "capture", "--out", good); r.Code != cli.ExitOK {
		t.Fatalf("capture: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
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
	if _, err := capture.Validate(f, capture.DefaultLimits); err != nil {
		t.Errorf("a capture with an escaped surrogate pair: %v", err)
	}

	for _, c := range []struct{ name, replacement, what string }{
		{"byte.jsonl.gz", "utf8-\xffmarker", "0xff"},
		{"lone-surrogate.jsonl.gz", `utf8-\udc80marker`, `\udc80`},
		{"high-surrogate-alone.jsonl.gz", `utf8-\ud83dmarker`, `\ud83d`},
	} {
		r := clitest.Run(t, replayEnv(t), "fixtures", "replay", "--from", variant(c.name, c.replacement))
		t.Logf("%s: exit %d: %s", c.name, r.Code, strings.TrimSpace(r.Stderr))
		if r.Code != cli.ExitUsage {
			t.Errorf("%s: exit %d, want %d\n%s", c.name, r.Code, cli.ExitUsage, r.Stdout)
		}
		for _, w := range []string{"row 1 of pgflow.runs", "not valid UTF-8", c.what} {
			if !strings.Contains(r.Stderr, w) {
				t.Errorf("%s: the error does not say %q", c.name, w)
			}
		}
	}
}

// TestCaptureRefusesTextThatIsNotUTF8: a SQL_ASCII database keeps any bytes
// in its text; a capture of it would carry U+FFFD in their place (JSON is
// UTF-8), so capture refuses, exit 1, naming the table and the row, and
// leaves no file.
func TestCaptureRefusesTextThatIsNotUTF8(t *testing.T) {
	ctx := context.Background()
	srv := testdb.Server(t)
	name := pgprovider.RandomName("pgflow_upgrade_test_ascii_")
	admin, err := session.Open(ctx, srv.AdminDSN(), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "create database "+pgx.Identifier{name}.Sanitize()+
		" encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.DropDatabase(context.Background(), name) })
	dsnValue := srv.DSNFor(name)
	if r := clitest.Run(t, nil, "--dsn", dsnValue, "fixtures", "load", "inflight"); r.Code != cli.ExitOK {
		t.Fatalf("fixtures load into a SQL_ASCII database: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	conn := testdb.Connect(t, dsnValue)
	defer conn.Close(ctx)
	// The first run (in the table's order) gets a byte 0xff in its input.
	tag, err := conn.Exec(ctx, `update pgflow.runs set input = pg_catalog.jsonb_build_object('note', pg_catalog.convert_from('\xff'::bytea, 'SQL_ASCII'))
		where run_id = (select run_id from pgflow.runs order by run_id limit 1)`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("a byte 0xff in a run's input: %v (%d rows)", err, tag.RowsAffected())
	}
	out := filepath.Join(t.TempDir(), "ascii.jsonl.gz")
	r := clitest.Run(t, nil, "--dsn", dsnValue, "fixtures", "capture", "--out", out)
	t.Logf("exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	if r.Code != cli.ExitFindings {
		t.Errorf("exit %d, want %d", r.Code, cli.ExitFindings)
	}
	for _, w := range []string{"not valid UTF-8", "of pgflow.runs", "SQL_ASCII"} {
		if !strings.Contains(r.Stderr, w) {
			t.Errorf("the error does not say %q", w)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused capture left a file: %v", err)
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
