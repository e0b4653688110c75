package pgprovider

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// TestRemoveStaleClusterDirs: in a temp dir of the test's own, the cluster
// directories whose recorded owner is gone are removed, and nothing else:
// not a live owner's, not one without a record, not another user's, not
// one whose postmaster still runs, not a link, not another prefix.
func TestRemoveStaleClusterDirs(t *testing.T) {
	parent := t.TempDir()
	// A pid that is free: a process that has ended.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := cmd.Process.Pid
	if running(deadPID) {
		t.Skipf("pid %d was reused at once", deadPID)
	}
	me := currentOwner()
	if me.start == 0 || me.pidns == 0 {
		t.Fatalf("no start time or pid namespace for this process from /proc: %+v", me)
	}
	dead := owner{pid: deadPID, uid: os.Geteuid(), pidns: me.pidns}
	otherNamespace := dead
	otherNamespace.pidns = me.pidns + 1 // a pid of another container sharing the temp dir
	reused := me
	reused.start = me.start + 1 // this pid, but a process that started at another time
	otherUser := dead
	otherUser.uid = os.Geteuid() + 1

	mk := func(name string, o *owner, postmaster int) string {
		t.Helper()
		d := filepath.Join(parent, name)
		if err := os.MkdirAll(filepath.Join(d, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		if o != nil {
			if err := os.WriteFile(filepath.Join(d, OwnerFile), []byte(o.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if postmaster != 0 {
			pm := []byte(strconv.Itoa(postmaster) + "\n" + d + "\n")
			if err := os.WriteFile(filepath.Join(d, "data", "postmaster.pid"), pm, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	gone := []string{
		mk(ClusterDirPrefix+"dead", &dead, 0),
		mk(ClusterDirPrefix+"reused-pid", &reused, 0),
		mk(ClusterDirPrefix+"dead-postmaster-gone", &dead, deadPID),
	}
	kept := []string{
		mk(ClusterDirPrefix+"live", &me, 0),
		mk(ClusterDirPrefix+"no-record", nil, 0),
		mk(ClusterDirPrefix+"other-user", &otherUser, 0),
		mk(ClusterDirPrefix+"other-pid-namespace", &otherNamespace, 0),
		mk(ClusterDirPrefix+"postmaster-running", &dead, os.Getpid()),
		mk("pgflow-upgrade-standby-dead", &dead, 0),
	}
	target := mk("elsewhere", &dead, 0)
	link := filepath.Join(parent, ClusterDirPrefix+"link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link, target)
	garbled := mk(ClusterDirPrefix+"garbled", nil, 0)
	if err := os.WriteFile(filepath.Join(garbled, OwnerFile), []byte("pid x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, garbled)

	removed := removeStaleClusterDirs(parent)
	slices.Sort(removed)
	slices.Sort(gone)
	if !slices.Equal(removed, gone) {
		t.Errorf("removed %v, want %v", removed, gone)
	}
	for _, d := range gone {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
	for _, d := range kept {
		if _, err := os.Lstat(d); err != nil {
			t.Errorf("%s was removed (%v)", d, err)
		}
	}
}

// TestClaimClusterDirRecordsOwner: the record reads back as this process,
// which is not gone.
func TestClaimClusterDirRecordsOwner(t *testing.T) {
	d := filepath.Join(t.TempDir(), ClusterDirPrefix+"x")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	claimClusterDir(d, t.Logf)
	b, err := os.ReadFile(filepath.Join(d, OwnerFile))
	if err != nil {
		t.Fatal(err)
	}
	o, ok := parseOwner(b)
	if !ok || o != currentOwner() || o.start == 0 || o.gone() {
		t.Fatalf("record %q read as %+v (ok %v, gone %v)", b, o, ok, o.gone())
	}
	if _, err := os.Stat(d); err != nil {
		t.Fatalf("its own directory: %v", err)
	}
}
