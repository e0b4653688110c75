package capture_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A capture file is read as a stream: memory stays bounded whatever its
// size, and a file over a documented limit (capture.DefaultLimits) is
// refused with an error that names the limit.

// memBudget is what reading a capture may add to the heap: a whole replay
// must stay under 256 MB, whatever the capture's size.
const memBudget = 256 << 20

// gzipMember compresses s as one gzip member; members concatenated are one
// gzip stream to a reader, so a file of many gigabytes is written from a
// few compressed blocks.
func gzipMember(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	// BestSpeed: the level changes the file's size, not what a reader
	// decompresses, and BestCompression of a 64 MiB block costs seconds
	// under the race detector.
	w, err := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, s); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// peakHeap runs f while sampling the heap, and returns how far it rose
// above where it started. The heap sampled holds garbage not yet collected,
// so f runs under the collector setting the tool ships with (GOGC=100), not
// the test harness's (which collects less often to save CPU).
func peakHeap(f func()) uint64 {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(done)
	wg.Wait()
	if peak.Load() < base {
		return 0
	}
	return peak.Load() - base
}

// repeatedCapture returns a reader of a valid capture file: the header,
// reps times block (n records), and the end record. block is compressed
// once, before the reader is returned, so only the compressed member stays
// in memory.
func repeatedCapture(t testing.TB, block string, n, reps int) func() io.Reader {
	header := gzipMember(t, fuzzHeader+"\n")
	member := gzipMember(t, block)
	end := gzipMember(t, fmt.Sprintf(`{"end": {"records": %d}}`+"\n", n*reps))
	return func() io.Reader {
		readers := []io.Reader{bytes.NewReader(header)}
		for i := 0; i < reps; i++ {
			readers = append(readers, bytes.NewReader(member))
		}
		return io.MultiReader(append(readers, bytes.NewReader(end))...)
	}
}

// TestValidateCaptureStreams: 64 MiB of rows, built on the fly, are
// validated with the heap rising by a few megabytes. The budget here is a
// quarter of the input (a reader that held it could not pass), the ratio a
// larger file would give, at a fraction of the time under -race (measured:
// 3.1-3.9 MiB whether the input is 64 MiB, 256 MiB or 2 GiB).
func TestValidateCaptureStreams(t *testing.T) {
	testdb.SkipIfShort(t, "64 MiB of rows validated with the heap rising by a few megabytes")
	const input, budget = 64 << 20, 16 << 20
	row := `{"table": "pgflow.runs", "row": {"run_id": "00000000-0000-0000-0000-000000000000", "flow_slug": "f", "status": "started", "input": {"padding": "` + strings.Repeat("x", 400) + `"}}}` + "\n"
	perBlock := (4 << 20) / len(row)
	blockLen := perBlock * len(row)
	reps := input / blockLen
	file := repeatedCapture(t, strings.Repeat(row, perBlock), perBlock, reps)() // the block is garbage from here
	var info *capture.Info
	var err error
	grew := peakHeap(func() { info, err = capture.Validate(file, capture.DefaultLimits) })
	if err != nil {
		t.Fatal(err)
	}
	if info.Records != perBlock*reps || info.Bytes < int64(input-blockLen) {
		t.Fatalf("read %d records, %d bytes; want %d records, 64 MiB", info.Records, info.Bytes, perBlock*reps)
	}
	t.Logf("validated %d records, %.0f MiB decompressed; heap rose by %.1f MiB at most", info.Records, float64(info.Bytes)/(1<<20), float64(grew)/(1<<20))
	if grew > budget {
		t.Fatalf("the heap rose by %d MiB reading the capture, budget %d MiB", grew>>20, budget>>20)
	}
}

// TestCaptureLimits: a gzip bomb (one endless line), a file over the byte,
// record or queue limit, each refused with an error naming the limit, in
// bounded memory.
func TestCaptureLimits(t *testing.T) {
	testdb.SkipIfShort(t, "a gzip bomb (one endless line), a file over the byte, record or queue limit, each...")
	// 1 GiB of one line without a newline, from 64 MiB compressed once.
	bombMember, bombHeader := gzipMember(t, strings.Repeat("a", 64<<20)), gzipMember(t, fuzzHeader+"\n")
	bomb := func() io.Reader {
		rs := []io.Reader{bytes.NewReader(bombHeader)}
		for i := 0; i < 16; i++ {
			rs = append(rs, bytes.NewReader(bombMember))
		}
		return io.MultiReader(rs...)
	}
	flow := func(i int) string {
		return fmt.Sprintf(`{"table": "pgflow.flows", "row": {"flow_slug": "f%d"}}`+"\n", i)
	}
	var flows strings.Builder
	for i := 0; i < 1000; i++ {
		flows.WriteString(flow(i))
	}
	var queues strings.Builder
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&queues, `{"table": "pgmq.queue", "row": {"queue_name": "q%d"}}`+"\n", i)
	}
	cases := []struct {
		name string
		r    func() io.Reader
		lim  capture.Limits
		want string
	}{
		{"one endless line", bomb, capture.DefaultLimits, "limit MaxLineBytes"},
		{"bytes", repeatedCapture(t, flows.String(), 1000, 100),
			capture.Limits{MaxLineBytes: 1 << 20, MaxRecords: 1 << 30, MaxBytes: 1 << 20, MaxQueues: 10}, "limit MaxBytes"},
		{"records", repeatedCapture(t, flows.String(), 1000, 100),
			capture.Limits{MaxLineBytes: 1 << 20, MaxRecords: 5000, MaxBytes: 1 << 30, MaxQueues: 10}, "limit MaxRecords"},
		{"queues", repeatedCapture(t, queues.String(), 20, 1),
			capture.Limits{MaxLineBytes: 1 << 20, MaxRecords: 5000, MaxBytes: 1 << 30, MaxQueues: 10}, "limit MaxQueues"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.r()
			var err error
			grew := peakHeap(func() { _, err = capture.Validate(r, c.lim) })
			if !errors.Is(err, capture.ErrCaptureLimit) || !errors.Is(err, capture.ErrBadCapture) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want a refusal naming %q, got %v", c.want, err)
			}
			t.Logf("%v (heap rose by %.1f MiB)", err, float64(grew)/(1<<20))
			if grew > memBudget {
				t.Fatalf("the heap rose by %d MiB, budget %d MiB", grew>>20, memBudget>>20)
			}
		})
	}
}

// TestCaptureOrderIsEnforced: records out of the order capture writes (a
// message before its queue, a step before the flows) are refused, so that
// the restore can stream.
func TestCaptureOrderIsEnforced(t *testing.T) {
	for name, body := range map[string]string{
		"message before its queue": `{"table": "pgmq.q", "queue": "x", "row": {"msg_id": 1}}` + "\n" + `{"table": "pgmq.queue", "row": {"queue_name": "x"}}`,
		"flows after steps":        `{"table": "pgflow.steps", "row": {}}` + "\n" + `{"table": "pgflow.flows", "row": {}}`,
		"queue name too long":      `{"table": "pgmq.queue", "row": {"queue_name": "` + strings.Repeat("q", 48) + `"}}` + "\n" + `{"table": "pgflow.flows", "row": {}}`,
	} {
		_, err := capture.Validate(bytes.NewReader(gzipped(fuzzHeader+"\n"+body+"\n"+`{"end": {"records": 2}}`+"\n")), capture.DefaultLimits)
		if !errors.Is(err, capture.ErrBadCapture) {
			t.Errorf("%s: accepted (%v)", name, err)
		}
	}
}

// TestRestoreFileStreams: a capture of 100,000 flows (about 20 MB of JSON,
// many times that as decoded rows) restores from the file with the heap
// rising by far less than the file (measured: 4.9 MiB for 200,000 flows).
func TestRestoreFileStreams(t *testing.T) {
	testdb.SkipIfShort(t, "a capture of 100,000 flows restores from the file with the heap rising by far less than the file")
	ctx := context.Background()
	src := testdb.Baseline(t)
	if _, err := src.Pool.Exec(ctx, `select pgflow.create_flow('template_flow')`); err != nil {
		t.Fatal(err)
	}
	var row string
	if err := src.Pool.QueryRow(ctx, `select to_jsonb(f)::text from pgflow.flows f`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	path := filepath.Join(t.TempDir(), "flows.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	fmt.Fprintln(zw, fuzzHeader)
	for i := 0; i < n; i++ {
		fmt.Fprintf(zw, `{"table": "pgflow.flows", "row": %s}`+"\n", strings.Replace(row, `"template_flow"`, fmt.Sprintf(`"flow_%d_%s"`, i, strings.Repeat("p", 100)), 1))
	}
	fmt.Fprintf(zw, `{"end": {"records": %d}}`+"\n", n)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	dst := testdb.Empty(t)
	conn := testdb.Connect(t, dst.DSN)
	defer conn.Close(ctx)
	grew := peakHeap(func() { err = capture.RestoreFile(ctx, conn, path, capture.DefaultLimits) })
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := dst.Pool.QueryRow(ctx, `select count(*) from pgflow.flows`).Scan(&got); err != nil || got != n {
		t.Fatalf("restored %d flows (%v), want %d", got, err, n)
	}
	t.Logf("restored %d flows; heap rose by %.1f MiB at most", n, float64(grew)/(1<<20))
	if grew > 8<<20 {
		t.Fatalf("the heap rose by %d MiB restoring a streamed file, want under 8 MiB", grew>>20)
	}
}
