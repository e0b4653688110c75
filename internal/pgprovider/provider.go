// Package pgprovider is where throwaway PostgreSQL databases come from, for
// the test suite, the fixtures and `fixtures replay` alike.
//
// Providers are tried in a fixed order:
//
//  1. a DSN: an existing server; throwaway databases are created on it and
//     dropped afterwards;
//  2. a Docker engine that answers, in a build with -tags docker (the
//     default build links no Docker client): a container from an image that
//     has pgmq (through dockertest);
//  3. the PostgreSQL binaries on this machine: an ephemeral cluster in a
//     temporary directory on a free loopback port, run as an unprivileged user
//     when the process is root. This is the embedded default.
package pgprovider

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Kind names a provider.
type Kind string

const (
	KindDSN    Kind = "dsn"
	KindDocker Kind = "docker"
	KindLocal  Kind = "local"
)

// Options choose and configure the provider.
type Options struct {
	// DSN of an existing server with a role that may CREATE DATABASE. When
	// set, no other provider is tried.
	DSN string
	// DockerImage is the image used when a Docker engine answers. It must
	// offer the pgmq extension. Default DefaultDockerImage.
	DockerImage string
	// SkipDocker skips the Docker provider (PGFLOW_UPGRADE_NO_DOCKER=1).
	SkipDocker bool
	// Logf receives one line per provider decision; nil discards them.
	Logf func(format string, args ...any)
	// Settings are extra server settings for a local cluster (name → value).
	Settings map[string]string
	// Cron asks a local cluster to preload the real pg_cron (when this
	// machine's server has it) with cron.database_name = CronDatabaseName,
	// so that the database of that name can hold the pg_cron extension.
	// Other providers keep their own configuration; Server.Cron reports
	// what the server offers either way.
	Cron bool
	// PinSearchPath makes every connection string of the server carry
	// search_path = session.SearchPath, as the tool's own sessions do: a role
	// or database setting cannot put a writable schema first (`fixtures
	// replay` sets it; the test harness does not).
	PinSearchPath bool
	// ReuseInitdb lets a local cluster start from a copy of the data
	// directory an earlier initdb of the same binaries left in the
	// temporary directory (kept there for the next one), instead of running
	// initdb: the test harness starts a cluster per test binary.
	ReuseInitdb bool
	// Seed, with ReuseInitdb, is what a local cluster holds before its
	// first use (the test harness's template databases), cached like
	// initdb's result: see Seed.
	Seed *Seed
	// InMemory puts a local cluster's directory (and the initdb and seeded
	// caches) in /dev/shm when that is a memory filesystem with room
	// (MemoryDirMinFree), else in the temporary directory: the test
	// harness's clusters are thrown away, and on a disk filesystem their
	// writes, copies and removal cost CPU in the kernel. The tool's own
	// ephemeral cluster (`fixtures replay`) keeps the temporary directory: a
	// user's capture may not fit in memory.
	InMemory bool
}

// Seed is built once per machine and key: the first local cluster runs
// Fill, stops, and leaves a copy of its data directory in the temporary
// directory; every later cluster of the same binaries, settings, installed
// extensions and Key starts from a copy of that directory instead.
type Seed struct {
	// Key names what Fill builds: a different Key is a different cache.
	// It must change whenever what Fill would build changes.
	Key string
	// Fill builds the contents on a freshly initialised, running cluster.
	Fill func(ctx context.Context, s *Server) error
}

// DefaultDockerImage has PostgreSQL 15 with the pgmq extension available.
const DefaultDockerImage = "ghcr.io/pgmq/pg15-pgmq:v1.5.1"

// Server is a running PostgreSQL server on which throwaway databases can be
// created. Close stops what the provider started.
type Server struct {
	Kind    Kind
	Version string // server_version
	// adminURL connects to the maintenance database with a role that may
	// create and drop databases.
	adminURL *url.URL
	stop     func() error
	halt     func() error // a local cluster: stops the postmaster, keeps the directory
	detail   string
	// adminPool holds the sessions that create and drop databases: a test
	// run makes and drops one database per test, and a session per
	// statement cost a backend's start and exit each time.
	adminMu   sync.Mutex
	adminPool *pgxpool.Pool
	dir       string // local cluster directory, removed by Close
}

// Open returns the first provider that works, in the order of the package doc.
func Open(ctx context.Context, opts Options) (*Server, error) {
	s, err := open(ctx, opts)
	if err == nil && opts.PinSearchPath {
		q := s.adminURL.Query()
		q.Set("search_path", session.SearchPath)
		s.adminURL.RawQuery = q.Encode()
	}
	return s, err
}

func open(ctx context.Context, opts Options) (*Server, error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if opts.DSN != "" {
		s, err := openDSN(ctx, opts.DSN)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	if !opts.SkipDocker {
		s, err := openDocker(ctx, opts.DockerImage)
		if err == nil {
			return s, nil
		}
		logf("pgprovider: Docker not used: %v", err)
	}
	settings := opts.Settings
	if opts.Cron {
		settings = withCronPreload(settings, logf)
	}
	var seed *Seed
	if opts.ReuseInitdb {
		seed = opts.Seed
	}
	base := os.TempDir()
	if opts.InMemory {
		if dir, ok := memoryDir(); ok {
			base = dir
		}
	}
	return openLocal(ctx, base, settings, opts.ReuseInitdb, seed, logf)
}

func openDSN(ctx context.Context, raw string) (*Server, error) {
	cfg, err := session.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	u := &url.URL{Scheme: "postgres", Host: fmt.Sprintf("%s:%d", cfg.Host, cfg.Port), Path: "/" + cfg.Database}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	q := u.Query()
	if cfg.TLSConfig == nil {
		q.Set("sslmode", "disable")
	}
	if strings.HasPrefix(cfg.Host, "/") {
		q.Set("host", cfg.Host)
		u.Host = ""
		q.Set("port", fmt.Sprint(cfg.Port))
	}
	u.RawQuery = q.Encode()
	s := &Server{Kind: KindDSN, adminURL: u, stop: func() error { return nil }, detail: session.Describe(cfg)}
	if err := s.ping(ctx); err != nil {
		return nil, fmt.Errorf("connecting to the server given by the DSN (%s): %w", session.Describe(cfg), err)
	}
	return s, nil
}

// ping connects once and reads the server version.
func (s *Server) ping(ctx context.Context) error {
	conn, err := session.Open(ctx, s.AdminDSN(), session.Admin)
	if err != nil {
		return errors.New(session.RedactText(err.Error(), s.AdminDSN()))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.QueryRow(ctx, "show server_version").Scan(&s.Version)
}

// AdminDSN connects to the maintenance database of the server.
func (s *Server) AdminDSN() string { return s.adminURL.String() }

// DSNFor returns a connection string for database name on this server.
func (s *Server) DSNFor(name string) string {
	u := *s.adminURL
	u.Path = "/" + name
	return u.String()
}

// Describe says which provider this is and where, without a password.
func (s *Server) Describe() string {
	return fmt.Sprintf("%s (PostgreSQL %s, %s)", s.Kind, s.Version, s.detail)
}

// Close stops the server if the provider started it. Safe to call twice.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	s.closeAdmin()
	if s.stop == nil {
		return nil
	}
	stop := s.stop
	s.stop = nil
	return stop()
}

// RandomName returns prefix_ followed by 12 random hex digits: a database name
// that cannot collide with another test run on the same server.
func RandomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// CreateDatabase creates database name, cloned from template when template is
// not empty. Names are quoted with pgx.Identifier, never interpolated raw.
func (s *Server) CreateDatabase(ctx context.Context, name, template string) error {
	stmt := "create database " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		stmt += " template " + pgx.Identifier{template}.Sanitize()
		if s.copiesFiles() {
			stmt += " strategy file_copy"
		}
	}
	// Not cancelled midway: a CREATE DATABASE whose client goes away still
	// completes on the server, possibly after the caller's cleanup has
	// dropped the (not yet visible) name, leaving the database behind. It
	// is a file copy: the caller sees its cancellation right after.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := s.adminExec(cctx, fmt.Sprintf("creating database %q", name), stmt); err != nil {
		return err
	}
	return ctx.Err()
}

// copiesFiles says whether clones are made with STRATEGY FILE_COPY. Since
// PostgreSQL 15 the default (WAL_LOG) writes every block of the template into
// the WAL, which costs about 2.5 times the server CPU of copying the files
// for the small templates tests clone by the hundred. FILE_COPY forces a
// checkpoint instead: free on a cluster this provider started (fsync off,
// thrown away), not something to impose on a server given by a DSN.
func (s *Server) copiesFiles() bool {
	if s.Kind != KindLocal {
		return false
	}
	major, _, _ := strings.Cut(s.Version, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 15
}

// DropDatabase drops database name, terminating its sessions first (WITH
// (FORCE), PostgreSQL 13+). A missing database is not an error.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	stmt := "drop database if exists " + pgx.Identifier{name}.Sanitize() + " with (force)"
	return s.adminExec(ctx, fmt.Sprintf("dropping database %q", name), stmt)
}

// RenameDatabase renames database from to to (nobody may be connected to it).
func (s *Server) RenameDatabase(ctx context.Context, from, to string) error {
	stmt := "alter database " + pgx.Identifier{from}.Sanitize() + " rename to " + pgx.Identifier{to}.Sanitize()
	return s.adminExec(ctx, fmt.Sprintf("renaming database %q to %q", from, to), stmt)
}

// MarkTemplate flags a database as a template so that cloning it is allowed
// while nobody is connected, and refuses new connections to it.
func (s *Server) MarkTemplate(ctx context.Context, name string) error {
	stmt := "alter database " + pgx.Identifier{name}.Sanitize() + " with is_template true allow_connections false"
	if err := s.adminExec(ctx, fmt.Sprintf("marking %q as template", name), stmt); err != nil {
		return err
	}
	// A background worker may still be connected (pg_cron's launcher sits in
	// its cron.database_name): clones would wait on it forever. It cannot
	// come back while connections are refused.
	stmt = "select pg_catalog.pg_terminate_backend(pid) from pg_catalog.pg_stat_activity where datname = $1 and pid <> pg_catalog.pg_backend_pid()"
	return s.adminExec(ctx, fmt.Sprintf("disconnecting the sessions of template %q", name), stmt, name)
}

// DropTemplate undoes MarkTemplate and drops the database.
func (s *Server) DropTemplate(ctx context.Context, name string) error {
	stmt := "alter database " + pgx.Identifier{name}.Sanitize() + " with is_template false allow_connections true"
	if err := s.adminExec(ctx, fmt.Sprintf("unmarking template %q", name), stmt); err != nil {
		return err
	}
	return s.DropDatabase(ctx, name)
}

func (s *Server) adminExec(ctx context.Context, what, stmt string, args ...any) error {
	pool, err := s.admin(ctx)
	if err != nil {
		return fmt.Errorf("%s: connecting: %s", what, session.RedactText(err.Error(), s.AdminDSN()))
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s: connecting: %s", what, session.RedactText(err.Error(), s.AdminDSN()))
	}
	defer conn.Release()
	// CREATE DATABASE from a template fails while another clone of the same
	// template is being made; retry that briefly instead of failing a test.
	for attempt := 0; ; attempt++ {
		_, err = conn.Exec(ctx, stmt, args...)
		if err == nil || attempt >= 50 || !strings.Contains(err.Error(), "is being accessed by other users") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(time.Duration(20+attempt*10) * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// admin returns the pool of admin sessions, opening it on first use.
func (s *Server) admin(ctx context.Context) (*pgxpool.Pool, error) {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if s.adminPool == nil {
		pool, err := session.OpenPool(ctx, s.AdminDSN(), session.Options{Purpose: session.Admin, MaxConns: 4})
		if err != nil {
			return nil, err
		}
		s.adminPool = pool
	}
	return s.adminPool, nil
}

// closeAdmin closes the admin sessions (before the server stops, or is
// left to its owner).
func (s *Server) closeAdmin() {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if s.adminPool != nil {
		s.adminPool.Close()
		s.adminPool = nil
	}
}
