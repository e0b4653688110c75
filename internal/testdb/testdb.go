// Package testdb is the test harness: one PostgreSQL server per test binary
// (from internal/pgprovider: PGFLOW_UPGRADE_TEST_DSN, else Docker, else an
// ephemeral local cluster) and a fresh database per test, cloned from a
// template database that already holds what the test needs, so a fresh
// database costs a file copy, not a schema build.
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
//	db := testdb.Baseline(t) // pgmq + the real pgflow 0.16.0 engine
//
// Each database is dropped when its test ends, and the templates when the
// binary ends, so a DSN server is left as it was found.
package testdb

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
)

// Template kinds.
const (
	tplEmpty    = "empty"
	tplPGMQ     = "pgmq"
	tplBaseline = "baseline"
)

var (
	server    *pgprovider.Server
	serverErr error

	templatesMu sync.Mutex
	templates   = map[string]string{} // kind → database name
	pgmqKind    string
	announce    sync.Once
)

// Main opens the server, runs the tests, and removes everything it made,
// also when the run is interrupted.
func Main(m *testing.M) int {
	ctx := context.Background()
	opts := pgprovider.Options{
		DSN:         os.Getenv("PGFLOW_UPGRADE_TEST_DSN"),
		DockerImage: os.Getenv("PGFLOW_UPGRADE_DOCKER_IMAGE"),
		SkipDocker:  os.Getenv("PGFLOW_UPGRADE_NO_DOCKER") == "1",
		Logf:        func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	}
	server, serverErr = pgprovider.Open(ctx, opts)
	if serverErr != nil {
		fmt.Fprintf(os.Stderr, "testdb: no PostgreSQL server for the tests: %v\n", serverErr)
		return 1
	}
	fmt.Fprintf(os.Stderr, "testdb: provider %s\n", server.Describe())

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			fmt.Fprintln(os.Stderr, "testdb: interrupted; removing test databases and the server")
			cleanup()
			os.Exit(130)
		case <-done:
		}
	}()

	code := m.Run()
	close(done)
	signal.Stop(sigs)
	cleanup()
	return code
}

func cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	templatesMu.Lock()
	defer templatesMu.Unlock()
	for kind, name := range templates {
		if err := server.DropTemplate(ctx, name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: dropping template %s: %v\n", name, err)
		}
		delete(templates, kind)
	}
	if err := server.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: stopping the server: %v\n", err)
	}
}

// Server returns the shared server (admin access for role tests and the like).
func Server(t testing.TB) *pgprovider.Server {
	t.Helper()
	if server == nil {
		t.Fatalf("testdb: no server: call os.Exit(testdb.Main(m)) from TestMain (%v)", serverErr)
	}
	return server
}

// PGMQKindInUse reports which pgmq the templates got ("extension" or "standin").
func PGMQKindInUse() string { return pgmqKind }

// template returns the template database of a kind, building it on first use.
func template(t testing.TB, kind string) string {
	t.Helper()
	templatesMu.Lock()
	defer templatesMu.Unlock()
	if name, ok := templates[kind]; ok {
		return name
	}
	ctx := context.Background()
	s := Server(t)
	name := pgprovider.RandomName("pgflow_upgrade_tpl_" + kind)
	if err := s.CreateDatabase(ctx, name, ""); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if err := fill(ctx, s.DSNFor(name), kind); err != nil {
		_ = s.DropDatabase(ctx, name)
		t.Fatalf("testdb: building template %s: %v", kind, err)
	}
	if err := s.MarkTemplate(ctx, name); err != nil {
		_ = s.DropDatabase(ctx, name)
		t.Fatalf("testdb: %v", err)
	}
	templates[kind] = name
	return name
}

func fill(ctx context.Context, dsn, kind string) error {
	if kind == tplEmpty {
		return nil
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	got, err := fixtures.InstallPGMQ(ctx, conn)
	if err != nil {
		return err
	}
	pgmqKind = got
	announce.Do(func() { fmt.Fprintf(os.Stderr, "testdb: pgmq %s\n", got) })
	switch kind {
	case tplBaseline:
		return fixtures.InstallBaseline(ctx, conn)
	}
	return nil
}

// DB is a throwaway database for one test.
type DB struct {
	Name string
	DSN  string
	Pool *pgxpool.Pool
}

func fresh(t testing.TB, kind string) *DB {
	t.Helper()
	tpl := template(t, kind)
	s := Server(t)
	ctx := context.Background()
	name := pgprovider.RandomName("pgflow_upgrade_test")
	if err := s.CreateDatabase(ctx, name, tpl); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	db := &DB{Name: name, DSN: s.DSNFor(name)}
	cfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg.MaxConns = 20
	db.Pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: connecting to %s: %v", name, err)
	}
	t.Cleanup(func() {
		db.Pool.Close()
		if err := s.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("testdb: %v", err)
		}
	})
	return db
}

// Empty returns a fresh empty database.
func Empty(t testing.TB) *DB { t.Helper(); return fresh(t, tplEmpty) }

// PGMQ returns a fresh database with pgmq installed (extension or stand-in).
func PGMQ(t testing.TB) *DB { t.Helper(); return fresh(t, tplPGMQ) }

// Baseline returns a fresh database with pgmq, the Supabase stand-ins and
// the real pgflow 0.16.0 engine.
func Baseline(t testing.TB) *DB { t.Helper(); return fresh(t, tplBaseline) }
