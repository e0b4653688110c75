package pgprovider

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// TestLocalClusterLifecycle starts the embedded default, uses it through the
// DSN provider too, and checks that Close leaves nothing running or on disk.
func TestLocalClusterLifecycle(t *testing.T) {
	ctx := context.Background()
	var lines []string
	s, err := Open(ctx, Options{SkipDocker: true, Logf: func(f string, a ...any) { lines = append(lines, f) }})
	if err != nil {
		t.Fatalf("Open local: %v", err)
	}
	if s.Kind != KindLocal {
		t.Fatalf("Kind = %s, want local", s.Kind)
	}
	if !strings.HasPrefix(s.Version, "1") {
		t.Fatalf("unexpected server version %q", s.Version)
	}
	host := s.adminURL.Host

	// The DSN provider on the same server: create, clone and drop databases.
	d, err := Open(ctx, Options{DSN: s.AdminDSN()})
	if err != nil {
		t.Fatalf("Open DSN: %v", err)
	}
	if d.Kind != KindDSN {
		t.Fatalf("Kind = %s, want dsn", d.Kind)
	}
	tpl := RandomName("tpl")
	if err := d.CreateDatabase(ctx, tpl, ""); err != nil {
		t.Fatal(err)
	}
	conn, err := session.Open(ctx, d.DSNFor(tpl), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "create table marker(x int); insert into marker values (42)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := d.MarkTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	clone := RandomName("clone")
	if err := d.CreateDatabase(ctx, clone, tpl); err != nil {
		t.Fatal(err)
	}
	conn, err = session.Open(ctx, d.DSNFor(clone), session.Admin)
	if err != nil {
		t.Fatal(err)
	}
	var x int
	if err := conn.QueryRow(ctx, "select x from marker").Scan(&x); err != nil || x != 42 {
		t.Fatalf("clone does not hold the template's data: %v %d", err, x)
	}
	// DropDatabase terminates sessions still connected.
	if err := d.DropDatabase(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if err := d.DropTemplate(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	var left int
	admin, _ := session.Open(ctx, d.AdminDSN(), session.Admin)
	_ = admin.QueryRow(ctx, "select count(*) from pg_database where datname in ($1, $2)", tpl, clone).Scan(&left)
	admin.Close(ctx)
	if left != 0 {
		t.Fatalf("%d databases left behind", left)
	}

	dir := s.dir
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
		c.Close()
		t.Fatalf("server still accepts connections on %s after Close", host)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after Close (%v)", dir, err)
	}
	if len(lines) == 0 {
		t.Fatal("the provider logged no decision")
	}
}

func TestDockerWithoutEngineSaysSo(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	_, err := openDocker(context.Background(), "")
	if !errors.Is(err, ErrNoDockerEngine) {
		t.Fatalf("openDocker without an engine: got %v, want ErrNoDockerEngine", err)
	}
}

func TestDSNProviderUnreachable(t *testing.T) {
	// Port 1 on loopback: nothing listens there.
	_, err := Open(context.Background(), Options{DSN: "postgres://u:topsecret@127.0.0.1:1/db?connect_timeout=2"})
	if err == nil {
		t.Fatal("expected an error for an unreachable server")
	}
	if strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("error leaks the password: %v", err)
	}
}

func TestFindBinDir(t *testing.T) {
	dir, err := FindBinDir()
	if err != nil {
		t.Skipf("no PostgreSQL binaries on this machine: %v", err)
	}
	if _, err := os.Stat(dir + "/initdb"); err != nil {
		t.Fatalf("FindBinDir returned %s without initdb", dir)
	}
}
