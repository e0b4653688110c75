package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Signal tests run the real binary (built once per test binary), make it
// wait on a lock the test holds, see its backend waiting in pg_stat_activity,
// send SIGINT as Ctrl-C would, and check: exit code 130, the waiting
// statement cancelled (its backend is gone while the test still holds the
// lock: a client that merely disconnects leaves its backend queued behind the
// lock), the transaction rolled back (the database unchanged, no lock or
// advisory lock left), and for replay no throwaway database or cluster left.

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			binErr = fmt.Errorf("no go tool to build the binary: %w", err)
			return
		}
		// One directory per test process, named by its pid; directories of
		// test processes that are gone are removed here (a test binary has
		// no hook after its last test that this file could use).
		removeStaleBinDirs()
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("%s%d", binDirPrefix, os.Getpid()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "pgflow-upgrade")
		out, err := exec.Command(goBin, "build", "-o", binPath, "github.com/pgflow-upgrade/pgflow-upgrade/cmd/pgflow-upgrade").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

const binDirPrefix = "pgflow-upgrade-test-bin-"

func removeStaleBinDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), binDirPrefix+"*"))
	for _, d := range dirs {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(d), binDirPrefix+"%d", &pid); err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// started is a running binary whose stderr is collected.
type started struct {
	cmd    *exec.Cmd
	mu     sync.Mutex // guards stdout and stderr: exec copies stdout from its own goroutine
	stdout lockedBuffer
	stderr strings.Builder
	lines  chan string
	done   chan error
}

func start(t *testing.T, env []string, args ...string) *started {
	t.Helper()
	s := &started{lines: make(chan string, 1000), done: make(chan error, 1)}
	s.cmd = exec.Command(binary(t), args...)
	s.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	s.stdout.mu = &s.mu
	s.cmd.Stdout = &s.stdout
	pipe, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			select {
			case s.lines <- sc.Text():
			default:
			}
		}
		s.done <- s.cmd.Wait()
	}()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
		}
	})
	return s
}

// wait returns the exit code (a guard of a minute: a hung process fails).
func (s *started) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-s.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(time.Minute):
		_ = s.cmd.Process.Kill()
		t.Fatalf("the process did not end within a minute of SIGINT\n%s", s.output())
		return -1
	}
}

func (s *started) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stdout.b.String() + s.stderr.String()
}

// lockedBuffer is a bytes.Buffer written under mu.
type lockedBuffer struct {
	mu *sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is what was written so far.
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// until polls cond (a condition, not a timing assertion) with a guard.
func until(t *testing.T, what string, cond func() bool, s *started) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never saw: %s\n%s", what, s.output())
		}
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("the process ended before %s: %v\n%s", what, err, s.output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// backends counts the backends of application app on database db (any
// database with db == ""), optionally only those waiting on a lock.
func backends(t *testing.T, app, db string, waitingOnLock bool) int {
	t.Helper()
	return backendsOn(t, testdb.Server(t).AdminDSN(), app, db, waitingOnLock)
}

func backendsOn(t *testing.T, adminDSN, app, db string, waitingOnLock bool) int {
	t.Helper()
	conn, err := session.Open(context.Background(), adminDSN, session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `select count(*) from pg_stat_activity
		where application_name = $1 and ($2 = '' or datname = $2) and (not $3 or wait_event_type = 'Lock')`,
		app, db, waitingOnLock).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// eventually polls cond for up to guard and says whether it became true.
func eventually(cond func() bool, guard time.Duration) bool {
	deadline := time.Now().Add(guard)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func interrupt(t *testing.T, s *started) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
}

func TestSignalAudit(t *testing.T) {
	db := clitest.LegacyDB(t)
	before := testdb.State(t, db.Pool)
	release := db.HoldLock(t, `lock table pgflow.step_tasks in access exclusive mode`)
	s := start(t, []string{"PGFLOW_UPGRADE_DSN=" + db.DSN}, "audit", "--lock-timeout", "5m", "--check-timeout", "5m", "--timeout", "10m")
	until(t, "the audit's backend waiting on the lock", func() bool {
		return backends(t, "pgflow-upgrade audit", db.Name, true) > 0
	}, s)
	interrupt(t, s)
	code := s.wait(t)
	// Still holding the lock: the audit's backend must be gone already.
	cancelled := eventually(func() bool { return backends(t, "pgflow-upgrade audit", db.Name, false) == 0 }, 15*time.Second)
	release()
	if !cancelled {
		// The CLI sends a cancel request on Ctrl-C (app.go prepareConfig):
		// a backend still queued behind the lock is a regression.
		t.Fatalf("the backend is still there after Ctrl-C: the statement was not cancelled\n%s", s.output())
	}
	if code != cli.ExitInterrupted {
		t.Fatalf("exit %d, want %d\n%s", code, cli.ExitInterrupted, s.output())
	}
	if !strings.Contains(s.output(), "interrupt") && !strings.Contains(s.output(), "cancel") {
		t.Errorf("the output does not say it was interrupted:\n%s", s.output())
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "interrupted audit")
}

func TestSignalApply(t *testing.T) {
	db := clitest.LegacyDB(t)
	before := testdb.State(t, db.Pool)
	// apply takes its table locks first thing after the advisory lock and the
	// privileges check: it queues behind this one.
	release := db.HoldLock(t, `lock table pgflow.flows in access share mode`)
	s := start(t, []string{"PGFLOW_UPGRADE_DSN=" + db.DSN}, "apply", "--yes", "--lock-timeout", "5m", "--lock-retries", "0")
	until(t, "apply's backend waiting on the table lock", func() bool {
		return backends(t, "pgflow-upgrade apply", db.Name, true) > 0
	}, s)
	interrupt(t, s)
	code := s.wait(t)
	cancelled := eventually(func() bool { return backends(t, "pgflow-upgrade apply", db.Name, false) == 0 }, 15*time.Second)
	release()
	if !cancelled {
		// The CLI sends a cancel request on Ctrl-C (app.go prepareConfig):
		// a backend still queued behind the lock is a regression.
		t.Fatalf("the backend is still there after Ctrl-C: the statement was not cancelled\n%s", s.output())
	}
	if code != cli.ExitInterrupted {
		t.Fatalf("exit %d, want %d\n%s", code, cli.ExitInterrupted, s.output())
	}
	if !strings.Contains(s.output(), "interrupted") {
		t.Errorf("the output does not say it was interrupted:\n%s", s.output())
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "interrupted apply")
	var locks int
	if err := db.Pool.QueryRow(context.Background(), `select count(*) from pg_locks where locktype = 'advisory' and database = (select oid from pg_database where datname = current_database())`).Scan(&locks); err != nil || locks != 0 {
		t.Fatalf("advisory locks left: %d (%v)", locks, err)
	}
	// And a new apply goes through: nothing of the interrupted one is left.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("apply after the interrupted one: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestSignalReplayOnServer gives replay a server of the test's own (so no
// other test's replay databases are counted) and interrupts it while its
// scenarios run.
func TestSignalReplayOnServer(t *testing.T) {
	testdb.SkipIfShort(t, "gives replay a server of the test's own (so no other test's replay databases are...")
	srv, err := pgprovider.Open(context.Background(), pgprovider.Options{SkipDocker: true})
	if err != nil {
		t.Skipf("no server of its own for the replay: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	s := start(t, []string{"PGFLOW_UPGRADE_NO_DOCKER=1", "PGFLOW_UPGRADE_DSN=" + srv.AdminDSN()}, "fixtures", "replay")
	until(t, "a scenario's database in use", func() bool {
		return backendsOn(t, srv.AdminDSN(), "pgflow-upgrade replay", "", false) > 0
	}, s)
	interrupt(t, s)
	code := s.wait(t)
	if code != cli.ExitInterrupted {
		t.Fatalf("exit %d, want %d (did the replay finish before the signal?)\n%s", code, cli.ExitInterrupted, s.output())
	}
	// The scenarios the signal cut short were interrupted, not failed
	// (before: 12-13 "replay: FAIL ..." lines).
	out := s.output()
	t.Logf("the interrupted replay's output:\n%s", out)
	if strings.Contains(out, "FAIL") || !strings.Contains(out, "replay: interrupted: ") || !strings.Contains(out, "interrupted (not failed): ") {
		t.Errorf("the interrupted replay's output:\n%s", out)
	}
	if left := replayDatabasesOn(t, srv.AdminDSN()); len(left) > 0 {
		t.Fatalf("throwaway databases left after the interrupted replay: %v\n%s", left, s.output())
	}
	if n := backendsOn(t, srv.AdminDSN(), "pgflow-upgrade replay", "", false); n != 0 {
		t.Fatalf("%d replay backends left", n)
	}
}

func TestSignalReplayEphemeralCluster(t *testing.T) {
	testdb.SkipIfShort(t, "an interrupted replay on its own ephemeral cluster leaves no cluster behind (starts a cluster: 15 s)")
	s := start(t, []string{"PGFLOW_UPGRADE_NO_DOCKER=1"}, "fixtures", "replay")
	var clusterDir string
	until(t, "the ephemeral cluster and the first scenario", func() bool {
		out := s.output()
		if i := strings.Index(out, "ephemeral cluster in "); i >= 0 && clusterDir == "" {
			clusterDir = strings.Fields(out[i+len("ephemeral cluster in "):])[0]
		}
		return clusterDir != "" && strings.Contains(out, "replay: baseline template")
	}, s)
	interrupt(t, s)
	code := s.wait(t)
	if code != cli.ExitInterrupted {
		t.Fatalf("exit %d, want %d\n%s", code, cli.ExitInterrupted, s.output())
	}
	if _, err := os.Stat(clusterDir); !os.IsNotExist(err) {
		t.Fatalf("the ephemeral cluster %s is still there (%v)\n%s", clusterDir, err, s.output())
	}
	// No postmaster of that cluster is left running.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(clusterDir)) {
			t.Fatalf("a process of the removed cluster is still running: %s %q", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}
