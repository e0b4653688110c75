package cli

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mattn/go-runewidth"
)

// TestTablesFitHundredColumns: a replay result table as wide as the one
// that printed ~220 columns, and an audit findings table, fit 100 columns
// with no word lost.
func TestTablesFitHundredColumns(t *testing.T) {
	long := strings.Repeat("the upgrade keeps every row and message identical and queue_name right everywhere; ", 4)
	cases := []struct {
		header []string
		rows   [][]string
	}{
		{[]string{"scenario", "result", "time", "what it proves"}, [][]string{
			{"old-worker-during-upgrade", "FAIL", "12.3s", long + "\n✗ " + long},
			{"clean-upgrade", "PASS", "1.0s", "short"},
		}},
		{[]string{"severity", "check", "count", "finding", "remedy"}, [][]string{
			{"blocker", "queue.envelope_contradiction", "at least 10000", long, "select pgmq.archive('<queue>', <message_id>) " + long},
		}},
		{[]string{"a"}, [][]string{{strings.Repeat("x", 300)}}}, // one word wider than the table
	}
	for _, c := range cases {
		var buf bytes.Buffer
		if err := writeTable(&buf, c.header, c.rows); err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(buf.String(), "\n") {
			if w := runewidth.StringWidth(line); w > tableWidth {
				t.Errorf("line of %d columns:\n%s", w, buf.String())
				break
			}
		}
		fitted := fitTable(c.header, c.rows, tableWidth)
		for i, r := range c.rows {
			for j := range r {
				got := strings.Join(strings.Fields(fitted[i][j]), "")
				if want := strings.Join(strings.Fields(r[j]), ""); got != want {
					t.Errorf("cell %d/%d lost text: %q -> %q", i, j, r[j], fitted[i][j])
				}
			}
		}
	}
	// A table that fits is left alone.
	rows := [][]string{{"a b c", "d"}}
	if got := fitTable([]string{"x", "y"}, rows, tableWidth); got[0][0] != "a b c" {
		t.Errorf("a narrow table was rewrapped: %q", got)
	}
}

// syncBuffer is a bytes.Buffer safe for the heartbeat's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls until out holds want (no timing is asserted: the deadline
// only stops a broken test).
func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in:\n%s", want, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHeartbeat: while a step runs and nothing else is printed, the
// heartbeat says so; once idle it is silent.
func TestHeartbeat(t *testing.T) {
	var out syncBuffer
	a := &App{Stderr: &out, heartbeatEvery: 10 * time.Millisecond}
	p := a.newProgress()
	defer p.stop()
	p.hb.say("[3/9] alter table pgflow.step_tasks ...", "    [3/9] alter table pgflow.step_tasks ...")
	waitFor(t, &out, "... still running (")
	waitFor(t, &out, "): [3/9] alter table pgflow.step_tasks")
	p.hb.say("", "  migrate done in 1s")
	n := strings.Count(out.String(), "still running")
	time.Sleep(50 * time.Millisecond) // idle: nothing more may come
	if m := strings.Count(out.String(), "still running"); m != n {
		t.Errorf("idle heartbeat printed %d more lines:\n%s", m-n, out.String())
	}
}

// TestProgressInterval: off a terminal at most every 10 s (checked each
// second), on one every 3 s.
func TestProgressInterval(t *testing.T) {
	if got := (&App{}).progressEvery(); got+time.Second > 10*time.Second {
		t.Errorf("off a terminal: %s (+1s check) exceeds 10s", got)
	}
	if got := (&App{Interactive: true}).progressEvery(); got != 3*time.Second {
		t.Errorf("on a terminal: %s", got)
	}
}

// TestDevNullIsNotATerminal: /dev/null is a character device, yet a
// pipeline that redirects there is no person to prompt.
func TestDevNullIsNotATerminal(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Fatal("/dev/null counted as a terminal")
	}
}
