package pgprovider

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoPgBouncer means no pgbouncer binary is installed (Debian: pgbouncer).
var ErrNoPgBouncer = errors.New("pgbouncer is not installed (Debian: apt-get install pgbouncer; scripts/setup.sh does it)")

// Bouncer is a PgBouncer in transaction mode in front of a Server, as most
// hosted-Postgres connection strings point at one: session SETs and session
// advisory locks do not survive a transaction there, and named prepared
// statements break (PgBouncer < 1.21).
type Bouncer struct {
	port int
	dir  string
	proc *exec.Cmd
	srv  *Server
}

func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", ErrNoPgBouncer
}

// StartBouncer starts PgBouncer on a free loopback port in front of s, for the
// server's trust-authenticated role (local and DSN providers with trust auth).
func StartBouncer(ctx context.Context, s *Server) (*Bouncer, error) {
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	owner, err := unprivilegedUser() // pgbouncer refuses to run as root too
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgflow-upgrade-bouncer-")
	if err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(s.adminURL.Host)
	if err != nil {
		return nil, fmt.Errorf("server address %q: %w", s.adminURL.Host, err)
	}
	user := s.adminURL.User.Username()
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
admin_users = %s
max_client_conn = 500
default_pool_size = 40
ignore_startup_parameters = extra_float_digits,options
logfile = %s
pidfile = %s
`, host, portStr, port, filepath.Join(dir, "userlist.txt"), user, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  strconv.Quote(user) + ` ""` + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	if err := owner.chownTree(dir); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	owner.apply(cmd, dir)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	cmd.SysProcAttr.Setpgid = true
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting pgbouncer: %w", err)
	}
	b := &Bouncer{port: port, dir: dir, proc: cmd, srv: s}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return b, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.Close()
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return nil, fmt.Errorf("pgbouncer did not listen on %d: %s %s", port, out.String(), log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DSNFor connects to database name through the bouncer. pgx's default
// statement cache uses named prepared statements, which transaction pooling
// breaks; simple_protocol is the setting the README documents for poolers.
func (b *Bouncer) DSNFor(name string) string {
	u := url.URL{Scheme: "postgres", User: b.srv.adminURL.User, Host: fmt.Sprintf("127.0.0.1:%d", b.port), Path: "/" + name}
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	return u.String()
}

// Close stops the bouncer and removes its directory.
func (b *Bouncer) Close() {
	if b.proc != nil && b.proc.Process != nil {
		_ = b.proc.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = b.proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = b.proc.Process.Kill()
			<-done
		}
	}
	os.RemoveAll(b.dir)
}
