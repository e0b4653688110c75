package pgprovider

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// An ephemeral cluster's directory (ClusterDirPrefix* in the temp dir, about
// 90 MB) is removed by Server.Close, and by nothing when the process that
// made it is killed (SIGKILL, the OOM killer, a lost CI runner): the kernel
// stops the postmaster (Pdeathsig), the directory stays. So each new
// cluster records the process that made it in its directory (OwnerFile),
// and the next cluster made on this machine removes the directories whose
// owner is gone. Only those: a directory is removed when its name has the
// prefix, it is a real directory (not a link), it holds an owner record
// written by a process of the same user, that process no longer runs (its
// pid is free, or taken by a process that started at another time; judged
// only in the pid namespace the owner ran in), and no postmaster runs in it. A directory without a record (another tool's, or
// one being made right now) is left alone.

// ClusterDirPrefix starts the name of every ephemeral cluster directory.
const ClusterDirPrefix = "pgflow-upgrade-pg-"

// OwnerFile, in a cluster directory, records the process that made it.
const OwnerFile = "pgflow-upgrade-owner"

// owner is what OwnerFile holds: the pid, the process's start time in clock
// ticks since boot (field 22 of /proc/<pid>/stat, to tell a reused pid
// apart; 0 when unknown), the effective uid, and the pid namespace (the
// inode of /proc/self/ns/pid; 0 when unknown): a pid only means something
// in its namespace, and a temp dir shared by containers is shared across
// them.
type owner struct {
	pid   int
	start uint64
	uid   int
	pidns uint64
}

func (o owner) String() string {
	return fmt.Sprintf("pid %d\nstart %d\nuid %d\npidns %d\n", o.pid, o.start, o.uid, o.pidns)
}

// currentOwner describes this process.
func currentOwner() owner {
	return owner{pid: os.Getpid(), start: processStart(os.Getpid()), uid: os.Geteuid(), pidns: pidNamespace()}
}

// pidNamespace is the inode of this process's pid namespace (0 when it
// cannot be read).
func pidNamespace() uint64 {
	l, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return 0
	}
	var n uint64
	if _, err := fmt.Sscanf(l, "pid:[%d]", &n); err != nil {
		return 0
	}
	return n
}

func parseOwner(b []byte) (owner, bool) {
	var o owner
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 63)
		if err != nil {
			return o, false
		}
		switch k {
		case "pid":
			o.pid, seen = int(n), seen|1
		case "start":
			o.start, seen = n, seen|2
		case "uid":
			o.uid, seen = int(n), seen|4
		case "pidns":
			o.pidns = n
		}
	}
	return o, seen == 7 && o.pid > 0
}

// processStart is the start time of process pid in clock ticks since boot
// (0 when it cannot be read: no /proc, or no such process).
func processStart(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after it start past the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); the start time is field 22.
	if len(f) < 20 {
		return 0
	}
	n, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// running says whether a process with this pid exists (one of another user
// included: EPERM).
func running(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// gone says whether the process o recorded has ended.
func (o owner) gone() bool {
	if !running(o.pid) {
		return true
	}
	// The pid is taken: by o's process, or by a later one that reuses it.
	now := processStart(o.pid)
	return o.start != 0 && now != 0 && now != o.start
}

// postmasterRunning says whether the postmaster of data (its
// postmaster.pid, first line) still runs.
func postmasterRunning(data string) bool {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	return err == nil && pid > 0 && running(pid)
}

// claimClusterDir records this process as the owner of dir, a cluster
// directory it has just made, then removes the cluster directories in dir's
// parent that processes of this tool left when they were killed. Both are
// best effort: a failure is logged, and the cluster is made all the same.
func claimClusterDir(dir string, logf func(string, ...any)) {
	me := currentOwner()
	if err := os.WriteFile(filepath.Join(dir, OwnerFile), []byte(me.String()), 0o644); err != nil {
		logf("pgprovider: could not record this process as the owner of %s (%v): if it is killed, the directory stays", dir, err)
	}
	for _, d := range removeStaleClusterDirs(filepath.Dir(dir)) {
		logf("pgprovider: removed %s, left by a killed run (its process is gone)", d)
	}
}

// removeStaleClusterDirs removes the cluster directories in parent whose
// owner, a process of the current user in this pid namespace, has ended
// (see the top of this file), and returns them.
func removeStaleClusterDirs(parent string) []string {
	me := currentOwner()
	dirs, _ := filepath.Glob(filepath.Join(parent, ClusterDirPrefix+"*"))
	var removed []string
	for _, d := range dirs {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() {
			continue // a link or a file: not a directory this tool made
		}
		f := filepath.Join(d, OwnerFile)
		st, err := os.Lstat(f)
		if err != nil || !st.Mode().IsRegular() || st.Size() > 256 {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		o, ok := parseOwner(b)
		if !ok || o.uid != me.uid || o.pidns != me.pidns || !o.gone() || postmasterRunning(filepath.Join(d, "data")) {
			continue
		}
		if err := os.RemoveAll(d); err == nil {
			removed = append(removed, d)
		}
	}
	return removed
}
