// Package testdb is the test harness: one PostgreSQL server per test binary
// (from internal/pgprovider: PGFLOW_UPGRADE_TEST_DSN, else Docker, else an
// ephemeral local cluster) and a fresh database per test, cloned from a
// template database that already holds what the test needs, so a fresh
// database costs a file copy, not a schema build.
//
//	func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
//	db := testdb.Baseline(t) // pgmq + the real pgflow 0.16.0 engine
//
// A DB's Pool hands out session.Test sessions: search_path is pinned as in
// the tool's own, so test SQL that forgets its schema fails (the templates
// are built by session.Admin ones, which keep the server's path).
//
// On the ephemeral cluster the harness starts, the templates are built once
// per machine: the cluster starts from a seeded copy of a data directory
// that already holds them (pgprovider.Seed, keyed by everything they are
// built from). On a DSN or Docker server each binary builds them on first
// use.
//
// Each database is dropped when its test ends, and the templates a binary
// built when it ends, so a DSN server is left as it was found.
package testdb

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

var (
	server    *pgprovider.Server
	serverErr error
	cron      pgprovider.CronInfo

	templatesMu sync.Mutex
	templates   = map[string]templateInfo{} // by kind
)

// The variables that choose the stand-ins over the real extensions.
const (
	envPGMQStandIn = "PGFLOW_UPGRADE_PGMQ_STANDIN"
	envNoCron      = "PGFLOW_UPGRADE_NO_CRON"
	// envPGMQVersion: the templates' real pgmq is updated to this version
	// (e.g. 1.13.1) before anything uses it, to run a package on it.
	envPGMQVersion = "PGFLOW_UPGRADE_TEST_PGMQ"
)

// Main opens the server, runs the tests, and removes everything it made,
// also when the run is interrupted.
func Main(m *testing.M) int {
	ctx := context.Background()
	if os.Getenv("GOGC") == "" {
		// A test binary is short-lived and the machine has memory to spare:
		// collecting a quarter as often saves about a tenth of the CPU of a
		// race-enabled binary. GOGC set by the caller wins.
		debug.SetGCPercent(400)
	}
	opts := pgprovider.Options{
		DSN:         os.Getenv("PGFLOW_UPGRADE_TEST_DSN"),
		DockerImage: os.Getenv("PGFLOW_UPGRADE_DOCKER_IMAGE"),
		SkipDocker:  os.Getenv("PGFLOW_UPGRADE_NO_DOCKER") == "1",
		Logf:        func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
		Cron:        os.Getenv(envNoCron) != "1",
		ReuseInitdb: true,
		Seed:        templateSeed(),
		InMemory:    true,
	}
	server, serverErr = pgprovider.Open(ctx, opts)
	if serverErr != nil {
		fmt.Fprintf(os.Stderr, "testdb: no PostgreSQL server for the tests: %v\n", serverErr)
		return 1
	}
	fmt.Fprintf(os.Stderr, "testdb: provider %s\n", server.Describe())
	if err := announceComponents(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "testdb: %v\n", err)
		cleanup()
		return 1
	}

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
	for kind, info := range templates {
		if info.seeded {
			continue // goes with the cluster
		}
		if err := server.DropTemplate(ctx, info.name); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: dropping template %s: %v\n", info.name, err)
		}
		if info.cronHome != "" {
			if err := server.DropDatabase(ctx, info.cronHome); err != nil {
				fmt.Fprintf(os.Stderr, "testdb: dropping %s: %v\n", info.cronHome, err)
			}
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

// PGMQKindInUse reports which pgmq the templates got ("extension" or
// "standin"; "" before any was built).
func PGMQKindInUse() string {
	templatesMu.Lock()
	defer templatesMu.Unlock()
	for _, info := range templates {
		if info.pgmq != "" {
			return info.pgmq
		}
	}
	return ""
}

// RequireRealCron skips a test that needs the real pg_cron when Baseline
// databases get the stand-in, saying why.
func RequireRealCron(t testing.TB) {
	t.Helper()
	if !cron.Available {
		t.Skipf("needs the real pg_cron extension; Baseline databases get the stand-in (%s)", cron.Why)
	}
}

// announceComponents decides and prints, once per test binary, which pgmq
// and which pg_cron the templates get: the real extensions where the server
// offers them, else the stand-ins, with the reason.
func announceComponents(ctx context.Context) error {
	var err error
	if cron, err = cronOffered(ctx, server); err != nil {
		return err
	}
	if err := adoptSeededTemplates(ctx); err != nil {
		return err
	}
	conn, err := session.Open(ctx, server.AdminDSN(), session.Admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var pgmqVersion string
	if err := conn.QueryRow(ctx, `select coalesce((select default_version from pg_catalog.pg_available_extensions
	                                               where name = 'pgmq'), '')`).Scan(&pgmqVersion); err != nil {
		return fmt.Errorf("asking the server about pgmq: %w", err)
	}
	newest, err := pgmqNewestOffered(ctx, conn)
	if err != nil {
		return fmt.Errorf("asking the server about pgmq's versions: %w", err)
	}
	var pgmqLine, cronLine string
	switch {
	case os.Getenv(envPGMQStandIn) == "1":
		pgmqLine = "pgmq: the project's stand-in (PGFLOW_UPGRADE_PGMQ_STANDIN=1)"
	case pgmqVersion != "" && os.Getenv(envPGMQVersion) != "":
		pgmqLine = "pgmq: real extension " + pgmqVersion + " updated to " + os.Getenv(envPGMQVersion) + " in the templates (" + envPGMQVersion + ")"
	case pgmqVersion != "" && newest != pgmqVersion:
		pgmqLine = "pgmq: real extension " + pgmqVersion + " (update scripts up to " + newest + " installed; a test that updates says so)"
	case pgmqVersion != "":
		pgmqLine = "pgmq: real extension " + pgmqVersion + " (no update scripts installed)"
	default:
		pgmqLine = "pgmq: the project's stand-in (the server offers no pgmq extension)"
	}
	if cron.Available {
		cronLine = fmt.Sprintf("pg_cron: real extension %s (in Baseline databases; cron.database_name = %s)", cron.Version, cron.Database)
	} else {
		cronLine = fmt.Sprintf("pg_cron: the project's stand-in (%s)", cron.Why)
	}
	fmt.Fprintf(os.Stderr, "testdb: %s\ntestdb: %s\n", pgmqLine, cronLine)
	// go test shows a passing package's output only with -v: make test
	// collects one line per binary here and prints the tally at the end.
	if path := os.Getenv("PGFLOW_UPGRADE_COMPONENTS_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("PGFLOW_UPGRADE_COMPONENTS_LOG: %w", err)
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "%s; %s\n", pgmqLine, cronLine); err != nil {
			return fmt.Errorf("PGFLOW_UPGRADE_COMPONENTS_LOG: %w", err)
		}
	}
	return nil
}

// DB is a throwaway database for one test.
type DB struct {
	Name string
	DSN  string
	// Pool's sessions are session.Test ones: search_path pinned. A test
	// opens more with Connect(t, db.DSN) (session.Test), or with session.Open
	// and an explicitly unpinned purpose when that is what it tests.
	Pool *pgxpool.Pool
}

func fresh(t testing.TB, kind string) *DB {
	t.Helper()
	tpl := template(t, kind)
	// The clone stands for the database pg_cron runs in: the jobs the
	// template recorded name the template, as a job of this database
	// names this one (real pg_cron and the stand-in alike).
	return cloneOf(t, tpl.name, kind == tplBaseline && tpl.cron != "")
}

// cloneOf creates a database cloned from source, opens its pool, and drops
// it when t ends. With cronJobs, the jobs source recorded in cron.job are
// pointed at the clone.
func cloneOf(t testing.TB, source string, cronJobs bool) *DB {
	t.Helper()
	s := Server(t)
	ctx := context.Background()
	name := pgprovider.RandomName("pgflow_upgrade_test")
	if err := s.CreateDatabase(ctx, name, source); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	db := &DB{Name: name, DSN: s.DSNFor(name)}
	t.Cleanup(func() {
		if db.Pool != nil {
			db.Pool.Close()
		}
		if err := s.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("testdb: %v", err)
		}
	})
	// A session.Test pool: search_path pinned as in the tool's own
	// sessions, so test SQL that forgets its schema fails here too.
	var err error
	db.Pool, err = session.OpenPool(ctx, db.DSN, session.Options{Purpose: session.Test, MaxConns: 20})
	if err != nil {
		t.Fatalf("testdb: connecting to %s: %v", name, err)
	}
	if cronJobs {
		if _, err := db.Pool.Exec(ctx, `update cron.job set database = pg_catalog.current_database() where database = $1`, source); err != nil {
			t.Fatalf("testdb: pointing the cloned cron jobs at %s: %v", name, err)
		}
	}
	return db
}

// Empty returns a fresh empty database.
func Empty(t testing.TB) *DB { t.Helper(); return fresh(t, tplEmpty) }

// PGMQ returns a fresh database with pgmq installed (extension or stand-in).
func PGMQ(t testing.TB) *DB { t.Helper(); return fresh(t, tplPGMQ) }

// Baseline returns a fresh database with pgmq, the Supabase stand-ins and
// the real pgflow 0.16.0 engine.
func Baseline(t testing.TB) *DB { t.Helper(); return fresh(t, tplBaseline) }
