package cli_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// smallTablespace is a tablespace of mb megabytes on the test's server: a
// tmpfs of that size mounted for the test, owned by the cluster's user.
// It needs root (mount) and the harness's local cluster (the tablespace's
// directory is on this machine); otherwise the test is skipped, saying
// why. Call it before creating the databases that use it: its cleanup
// (drop, unmount) then runs after theirs.
func smallTablespace(t *testing.T, srv *pgprovider.Server, mb int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk needs a small tmpfs, and mounting one needs root")
	}
	if srv.Kind != pgprovider.KindLocal {
		t.Skipf("a full disk needs a tablespace on this machine; the server is %s", srv.Kind)
	}
	owner, err := user.Lookup("postgres")
	if err != nil {
		t.Skipf("the cluster's user: %v", err)
	}
	// Not under t.TempDir(): its parent is the test user's only, and the
	// server's user must reach the directory.
	dir, err := os.MkdirTemp("", "pgflow-upgrade-small-tablespace-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) }) // runs last: after the unmount
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm,mode=0700", mb), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a %d MB tmpfs: %v: %s", mb, err, out)
	}
	uid, _ := strconv.Atoi(owner.Uid)
	gid, _ := strconv.Atoi(owner.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("pgflow_upgrade_small_%d", os.Getpid())
	ctx := context.Background()
	admin, err := session.Open(ctx, srv.AdminDSN(), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(ctx, "drop tablespace if exists "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Errorf("dropping the small tablespace: %v", err)
		}
		admin.Close(ctx)
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil { // then the directory goes
			t.Errorf("unmounting %s: %v: %s", dir, err, out)
		}
	})
	if _, err := admin.Exec(ctx, "create tablespace "+pgx.Identifier{name}.Sanitize()+" location "+quoteLiteral(dir)); err != nil {
		t.Fatal(err)
	}
	t.Logf("a %d MB tablespace %s on a tmpfs at %s", mb, name, dir)
	return name
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// fullDiskDB is a baseline database whose pgflow.step_tasks lives in a
// small tablespace it fills to more than half: the upgrade's rewrite of
// step_tasks (a new copy in the same tablespace) runs out of space.
func fullDiskDB(t *testing.T) (*testdb.DB, string) {
	t.Helper()
	ts := smallTablespace(t, testdb.Server(t), 8)
	db := testdb.Baseline(t)
	ctx := context.Background()
	db.Exec(t, "alter table pgflow.step_tasks set tablespace "+pgx.Identifier{ts}.Sanitize())
	if _, err := datagen.Generate(ctx, db.Pool, datagen.Shape{Tasks: 33_000, Flows: 1, LiveRuns: 1, LiveTasksPerRun: 3}); err != nil {
		t.Fatal(err)
	}
	var size int64
	if err := db.Pool.QueryRow(ctx, "select pg_catalog.pg_relation_size('pgflow.step_tasks')").Scan(&size); err != nil {
		t.Fatal(err)
	}
	t.Logf("pgflow.step_tasks: %d kB in the 8 MB tablespace", size/1024)
	return db, ts
}

// TestApplyDiskFull: apply's rewrite of step_tasks meets a full disk. Before,
// apply exited 1 (a refusal) with the bare SQLSTATE 53100 and then
// suggested "ready: run audit, then apply", which fails the same way until
// space is freed; now it exits 3 naming the disk, what to free and that
// nothing changed, with no next step that would fail alike, and a rerun
// after space is freed upgrades.
func TestApplyDiskFull(t *testing.T) {
	db, _ := fullDiskDB(t)
	before := testdb.State(t, db.Pool)
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes")
	out := r.Stdout + r.Stderr
	t.Logf("exit %d\n%s", r.Code, out)
	if r.Code != cli.ExitEnvironment {
		t.Errorf("exit %d, want %d (the environment)", r.Code, cli.ExitEnvironment)
	}
	text := strings.Join(strings.Fields(out), " ")
	for _, w := range []string{"the server ran out of disk space", "No space left on device", "free space on the volume",
		"the transaction was rolled back: nothing was changed", "a rerun fails the same way until then",
		"next step: fix the cause above first"} {
		if !strings.Contains(text, w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	if strings.Contains(text, "ready: run") {
		t.Error("the output suggests running apply again as if nothing stood in the way")
	}
	testdb.SameState(t, before, testdb.State(t, db.Pool), "after the full disk")
	db.Exec(t, "alter table pgflow.step_tasks set tablespace pg_default") // space freed
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("the rerun with space: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
