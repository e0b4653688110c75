package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// helperVar, set, makes the test binary the tool: it runs the arguments
// in helperArgs (JSON) and exits with their code, so a test can kill -9 a
// real fleet run in the middle.
const (
	helperVar  = "PGFLOW_UPGRADE_FLEET_HELPER"
	helperArgs = "PGFLOW_UPGRADE_FLEET_HELPER_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperVar) == "1" {
		var args []string
		if err := json.Unmarshal([]byte(os.Getenv(helperArgs)), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		app := &cli.App{Stdout: os.Stdout, Stderr: os.Stderr}
		code := app.Run(ctx, append([]string{"pgflow-upgrade"}, args...))
		stop()
		os.Exit(code)
	}
	os.Exit(testdb.Main(m))
}

// startTool runs the tool with args in a child process (this test binary,
// which TestMain makes the tool), its standard output into stdout unless
// nil.
func startTool(t *testing.T, stdout io.Writer, args []string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := json.Marshal(args)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperVar+"=1", helperArgs+"="+string(enc))
	cmd.Stdout = stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// waitDone waits until the ledger records done targets or within has
// passed, and returns how many it records.
func waitDone(ledger string, done int, within time.Duration) int {
	deadline := time.Now().Add(within)
	n := countDone(ledger)
	for n < done && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = countDone(ledger)
	}
	return n
}

// killAfter runs the tool with args in a child process and kills it with
// SIGKILL once the ledger records done targets; it fails t when within
// passes first.
func killAfter(t *testing.T, args []string, ledger string, done int, within time.Duration) {
	t.Helper()
	cmd := startTool(t, nil, args)
	waitDone(ledger, done, within)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if n := countDone(ledger); n < done {
		t.Fatalf("the fleet run recorded %d targets done in %s, want %d", n, within, done)
	} else {
		t.Logf("killed (SIGKILL) with %d targets recorded done", n)
	}
}

// blocked is clitest.LegacyDB with case-only flow aliases: a blocker for 0.17.0.
func blocked(t *testing.T) *testdb.DB {
	t.Helper()
	db := clitest.LegacyDB(t)
	db.Exec(t, `insert into pgflow.flows (flow_slug) values ('Foo'), ('foo')`)
	return db
}

// unreachableDSN points at a loopback port nothing listens on.
func unreachableDSN(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "postgres://postgres@" + addr + "/nothing?connect_timeout=5"
}

const secretPassword = "Fleet-S3cret-pw"

// writeTargets writes lines to a targets file only its owner reads.
func writeTargets(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "targets.txt")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// report reads a fleet's JSON report.
func report(t *testing.T, r clitest.Result) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("not JSON (exit %d): %v\n%s\n%s", r.Code, err, r.Stdout, r.Stderr)
	}
	return doc
}

// entry is the named target's entry of a JSON report.
func entry(t *testing.T, doc map[string]any, name string) map[string]any {
	t.Helper()
	for _, e := range doc["entries"].([]any) {
		if m := e.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("no entry %s in the report", name)
	return nil
}
