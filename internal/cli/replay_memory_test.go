package cli_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// captureHeader is the first line of a capture file.
const captureHeader = `{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline", "created_at": "2026-12-02T12:00:00Z"}`

// captureHeaderV2 and copyRow: a version 2 file's header and one row of
// pgflow.runs in COPY text.
const captureHeaderV2 = `{"format": "pgflow-upgrade-capture", "version": 2, "pgflow_state": "baseline", "created_at": "2026-12-02T12:00:00Z", "schemas": ["pgflow"], "tables": [{"table": "pgflow.runs", "rows": 1, "bytes": 1, "columns": ["run_id", "flow_slug", "input"]}]}`

var copyRow = `{"table": "pgflow.runs", "copy": "00000000-0000-0000-0000-000000000000\tf\t{\"padding\": \"` + strings.Repeat("x", 400) + `\"}"}` + "\n"

// writeMembers writes a capture file made of gzip members (a reader sees one
// stream): each block compressed once, written times[i] times. A file of
// gigabytes decompressed takes a few megabytes on disk.
func writeMembers(t *testing.T, path string, blocks []string, times []int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, block := range blocks {
		var b bytes.Buffer
		// BestSpeed: the level changes the file's size, not what the
		// replay decompresses; BestCompression of the three 64 MiB blocks
		// took 30 s of CPU under the race detector.
		w, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
		w.Write([]byte(block))
		w.Close()
		for j := 0; j < times[i]; j++ {
			if _, err := f.Write(b.Bytes()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestLongReplayFromHugeCaptureBoundedRSS runs the built binary on two hostile
// capture files and measures its peak RSS (getrusage): a gzip bomb whose
// second line never ends, and 512 MiB of repeated rows (the shape that once
// took 2.3 GB and crashed; twice the budget, so a reader that held them
// could not pass) whose end record is wrong, so the whole file is read
// before the refusal. Both end with exit 2 and a message, not a crash,
// under 256 MB.
func TestLongReplayFromHugeCaptureBoundedRSS(t *testing.T) {
	testdb.SkipUnlessLong(t, "replay of two hostile huge captures stays within its RSS bound")
	testdb.SkipIfShort(t, "the binary's peak RSS on a gzip bomb and on 512 MiB of rows stays under 256 MB")
	t.Parallel() // long and self-contained: overlaps the package's other long tests
	dir := t.TempDir()
	row := `{"table": "pgflow.runs", "row": {"run_id": "00000000-0000-0000-0000-000000000000", "flow_slug": "f", "status": "started", "input": {"padding": "` + strings.Repeat("x", 400) + `"}}}` + "\n"
	perBlock := (64 << 20) / len(row)
	const rowBytes = 512 << 20
	reps := rowBytes / (perBlock * len(row))
	cases := []struct {
		name, want string
		blocks     []string
		times      []int
	}{
		{"bomb.gz", "limit MaxLineBytes", []string{captureHeader + "\n", strings.Repeat("a", 64<<20)}, []int{1, 32}},
		{"rows.gz", "the end record says 1 records", []string{captureHeader + "\n", strings.Repeat(row, perBlock), `{"end": {"records": 1}}` + "\n"}, []int{1, reps, 1}},
		// Version 2: the rows of a captured schema as COPY text.
		{"copyrows.gz", "the end record says 1 records", []string{captureHeaderV2 + "\n", strings.Repeat(copyRow, (64<<20)/len(copyRow)), `{"end": {"records": 1}}` + "\n"}, []int{1, rowBytes / (64 << 20), 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name)
			writeMembers(t, path, c.blocks, c.times)
			fi, _ := os.Stat(path)
			cmd := exec.Command(binary(t), "fixtures", "replay", "--from", path)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PGFLOW_UPGRADE_NO_DOCKER=1", "PGFLOW_UPGRADE_PEAK_RSS=1", "PGFLOW_UPGRADE_DSN=" + testdb.Server(t).AdminDSN()}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			// The child's own high-water mark (VmHWM): getrusage's ru_maxrss
			// would include this test process's peak, inherited through exec.
			var kib int64
			if _, err := fmt.Sscanf(stderr.String()[strings.LastIndex(stderr.String(), "peak RSS "):], "peak RSS %d kB", &kib); err != nil {
				t.Fatalf("no peak RSS in the output (%v): %s", err, stderr.String())
			}
			rss := kib << 10
			t.Logf("%s (%.1f MB on disk): exit %d, peak RSS %.1f MiB: %s", c.name, float64(fi.Size())/1e6, code, float64(rss)/(1<<20), strings.TrimSpace(stderr.String()))
			if code != cli.ExitUsage || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("exit %d, want %d with %q", code, cli.ExitUsage, c.want)
			}
			if strings.Contains(stderr.String(), "goroutine ") || strings.Contains(stderr.String(), "fatal error") {
				t.Error("the process crashed")
			}
			if rss > 256<<20 {
				t.Errorf("peak RSS %d MiB, budget 256 MiB", rss>>20)
			}
		})
	}
}
