package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestReplayRemovesItsKilledRunsClusters: `fixtures replay` on the embedded
// default, killed with SIGKILL (no handler runs), leaves its ephemeral
// cluster's directory; the next replay removes it, and leaves alone a
// cluster directory of the same name pattern that is not provably its own
// (no owner record). The temp dir is the test's own (TMPDIR), open to the
// unprivileged user the cluster runs as under root.
func TestReplayRemovesItsKilledRunsClusters(t *testing.T) {
	testdb.SkipIfShort(t, "'fixtures replay' on the embedded default, killed with SIGKILL (no handler runs),...")
	tmp, err := os.MkdirTemp("", "pgflow-upgrade-stale-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(tmp, pgprovider.ClusterDirPrefix+"not-ours")
	if err := os.Mkdir(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PGFLOW_UPGRADE_NO_DOCKER=1", "TMPDIR=" + tmp}

	clusterOf := func(s *started) string {
		var dir string
		until(t, "the ephemeral cluster and the first scenario", func() bool {
			out := s.output()
			if i := strings.Index(out, "ephemeral cluster in "); i >= 0 && dir == "" {
				dir = strings.Fields(out[i+len("ephemeral cluster in "):])[0]
			}
			return dir != "" && strings.Contains(out, "replay: baseline template")
		}, s)
		return dir
	}

	first := start(t, env, "fixtures", "replay")
	left := clusterOf(first)
	if filepath.Dir(left) != tmp {
		t.Fatalf("the cluster %s is not in TMPDIR %s", left, tmp)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(t)
	// The kernel stops its postmaster (Pdeathsig); the directory stays.
	if !eventually(func() bool { return !processOf(left) }, 30*time.Second) {
		t.Fatalf("a process of the killed run's cluster %s still runs after 30 s", left)
	}
	if _, err := os.Stat(filepath.Join(left, "data")); err != nil {
		t.Fatalf("the killed run's cluster directory is not there to be cleaned (%v): the test proves nothing", err)
	}
	if _, err := os.Stat(filepath.Join(left, pgprovider.OwnerFile)); err != nil {
		t.Errorf("the killed run's cluster has no owner record: %v", err)
	}

	second := start(t, env, "fixtures", "replay")
	mine := clusterOf(second)
	interrupt(t, second)
	if code := second.wait(t); code != cli.ExitInterrupted {
		t.Errorf("the second replay: exit %d, want %d\n%s", code, cli.ExitInterrupted, second.output())
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the killed run's cluster %s is still there (%v)\n%s", left, err, second.output())
	}
	if !strings.Contains(second.output(), "removed "+left) {
		t.Errorf("the second replay does not say it removed %s", left)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a directory without an owner record was removed: %v", err)
	}
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Errorf("the interrupted replay left its own cluster %s (%v)", mine, err)
	}
}

// processOf says whether a running process has dir in its command line.
func processOf(dir string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			return true
		}
	}
	return false
}
