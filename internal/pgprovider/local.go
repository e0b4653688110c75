package pgprovider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoPostgresBinaries means neither PATH, pg_config nor
// /usr/lib/postgresql/*/bin has initdb and postgres.
var ErrNoPostgresBinaries = errors.New("no PostgreSQL server binaries found (looked in PATH, `pg_config --bindir`, /usr/lib/postgresql/*/bin); install PostgreSQL (Debian: apt-get install postgresql-15) or pass a DSN")

// FindBinDir returns a directory holding initdb and postgres.
func FindBinDir() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	sort.Slice(globbed, func(i, j int) bool { return versionOf(globbed[i]) > versionOf(globbed[j]) })
	candidates = append(candidates, globbed...)
	for _, dir := range candidates {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres")) {
			return dir, nil
		}
	}
	return "", ErrNoPostgresBinaries
}

func versionOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// runAs is the OS identity the cluster runs under: nil for the current user,
// or an unprivileged user when the process is root (initdb refuses root).
type runAs struct {
	uid, gid uint32
	name     string
	home     string
}

func unprivilegedUser() (*runAs, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &runAs{uid: uint32(uid), gid: uint32(gid), name: name, home: u.HomeDir}, nil
	}
	return nil, errors.New("running as root, and neither user postgres nor nobody exists to run the cluster as (initdb refuses root); create one with `useradd --system postgres`")
}

func (r *runAs) apply(cmd *exec.Cmd, dir string) {
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if r == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: r.uid, Gid: r.gid}}
	cmd.Env = append(cmd.Env, "HOME="+dir, "USER="+r.name)
	cmd.Dir = dir
}

// chownTree hands the cluster directory to the unprivileged user.
func (r *runAs) chownTree(dir string) error {
	if r == nil {
		return nil
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(r.uid), int(r.gid))
	})
}

// freeLoopbackPort asks the kernel for a free port on 127.0.0.1.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// defaultLocalSettings trade durability for speed: the cluster is thrown away.
var defaultLocalSettings = map[string]string{
	"fsync":                      "off",
	"synchronous_commit":         "off",
	"full_page_writes":           "off",
	"max_connections":            "300",
	"shared_buffers":             "256MB",
	"max_wal_size":               "4GB",
	"checkpoint_timeout":         "30min",
	"max_locks_per_transaction":  "256",
	"log_min_messages":           "warning",
	"lc_messages":                "C",
	"listen_addresses":           "127.0.0.1",
	"unix_socket_directories":    "", // set per cluster
	"dynamic_shared_memory_type": "posix",
}

// openLocal initialises and starts an ephemeral cluster. With a seed, the
// cluster starts from the seeded cache when there is one; otherwise it is
// initialised as usual, seeded, stopped, copied into the cache, and started
// again.
func openLocal(ctx context.Context, base string, extra map[string]string, reuseInitdb bool, seed *Seed, logf func(string, ...any)) (*Server, error) {
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	owner, err := unprivilegedUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, ClusterDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("creating the cluster directory: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	claimClusterDir(dir, logf) // stale.go: this process owns dir; directories of killed runs go
	if err := owner.chownTree(dir); err != nil {
		cleanup()
		return nil, fmt.Errorf("handing %s to the cluster user: %w", dir, err)
	}
	data := filepath.Join(dir, "data")
	seeded := ""
	if seed != nil {
		seeded = seedCacheDir(base, bin, extra, seed.Key)
		if startFromSeed(ctx, seeded, dir, data, owner, logf) {
			s, err := startOnFreePort(ctx, bin, dir, data, owner, extra, logf)
			if err != nil {
				cleanup()
			}
			return s, err
		}
	}
	if err := initCluster(ctx, base, bin, dir, data, owner, reuseInitdb, logf); err != nil {
		cleanup()
		return nil, err
	}
	s, err := startOnFreePort(ctx, bin, dir, data, owner, extra, logf)
	if err != nil {
		cleanup()
		return nil, err
	}
	if seed == nil {
		return s, nil
	}
	if err := seed.Fill(ctx, s); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("seeding the ephemeral cluster: %w", err)
	}
	// A clean shutdown leaves a data directory that starts without
	// recovery; the copy is taken while nothing runs in it.
	if err := s.halt(); err != nil {
		cleanup()
		return nil, fmt.Errorf("stopping the ephemeral cluster after seeding it: %w", err)
	}
	fillCache(ctx, seeded, dir, data, owner)
	s, err = startOnFreePort(ctx, bin, dir, data, owner, extra, logf)
	if err != nil {
		cleanup()
	}
	return s, err
}

// startOnFreePort starts the postmaster on a free loopback port, trying
// again on another port when the one found was taken before postgres bound it.
func startOnFreePort(ctx context.Context, bin, dir, data string, owner *runAs, extra map[string]string, logf func(string, ...any)) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freeLoopbackPort()
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		s, err := startPostmaster(ctx, bin, dir, data, port, owner, extra)
		if err == nil {
			who := "the current user"
			if owner != nil {
				who = "user " + owner.name
			}
			logf("pgprovider: ephemeral cluster in %s on 127.0.0.1:%d as %s", dir, port, who)
			return s, nil
		}
		lastErr = err // most likely the port was taken between probe and bind
	}
	return nil, lastErr
}

// startPostmaster runs postgres in the foreground as a child of a goroutine
// locked to its OS thread, with Pdeathsig: if this process dies (a failed
// test binary, kill -9), the kernel stops the postmaster too.
func startPostmaster(ctx context.Context, bin, dir, data string, port int, owner *runAs, extra map[string]string) (*Server, error) {
	settings := map[string]string{}
	for k, v := range defaultLocalSettings {
		settings[k] = v
	}
	settings["unix_socket_directories"] = dir
	for k, v := range extra {
		settings[k] = v
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port)}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}

	started := make(chan error, 1)
	exited := make(chan error, 1)
	var proc *os.Process
	go func() {
		// Pdeathsig fires when the creating thread exits, so this goroutine
		// keeps its thread until the postmaster is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
		owner.apply(cmd, dir)
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
		cmd.SysProcAttr.Setpgid = true // Ctrl-C in a terminal reaches us, not the postmaster directly
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		proc = cmd.Process
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting postgres: %w", err)
	}

	u := &url.URL{Scheme: "postgres", User: url.User("postgres"), Host: fmt.Sprintf("127.0.0.1:%d", port),
		Path: "/postgres", RawQuery: "sslmode=disable"}
	s := &Server{Kind: KindLocal, adminURL: u, detail: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
	var halted error
	var haltOnce sync.Once
	s.halt = func() error {
		s.closeAdmin()
		haltOnce.Do(func() {
			// SIGINT is PostgreSQL's "fast" shutdown: roll back, disconnect,
			// checkpoint, stop.
			_ = proc.Signal(syscall.SIGINT)
			select {
			case <-exited:
			case <-time.After(15 * time.Second):
				_ = proc.Kill()
				<-exited
				halted = errors.New("postgres did not stop within 15 s of a fast shutdown and was killed")
			}
			logFile.Close()
		})
		return halted
	}
	s.stop = func() error {
		_ = s.halt()
		return os.RemoveAll(dir)
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		err := s.ping(ctx)
		if err == nil {
			return s, nil
		}
		select {
		case exitErr := <-exited:
			logFile.Close()
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("postgres exited at start (%v): %s", exitErr, strings.TrimSpace(string(out)))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = s.halt() // the caller removes the directory
			return nil, fmt.Errorf("postgres on port %d did not accept connections: %w", port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MemoryDirMinFree is the room /dev/shm must have for Options.InMemory to
// use it: two clusters of the test suite at once, with their WAL.
const MemoryDirMinFree = 8 << 30

// memoryDir returns /dev/shm when it is a memory filesystem (tmpfs) this
// process may write with MemoryDirMinFree available.
func memoryDir() (string, bool) {
	const dir, tmpfsMagic = "/dev/shm", 0x01021994
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Type != tmpfsMagic {
		return "", false
	}
	if uint64(st.Bavail)*uint64(st.Bsize) < MemoryDirMinFree || syscall.Access(dir, 2 /* W_OK */) != nil {
		return "", false
	}
	return dir, true
}
