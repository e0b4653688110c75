package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Purpose is who a session is for. It decides how Config shapes the
// session: whether search_path is pinned, what application_name it gets,
// how it runs statements and how it reacts when its context ends.
type Purpose int

const (
	// Tool is the tool's own session, as every command opens it:
	// search_path pinned (SearchPath, see pin), application_name
	// "pgflow-upgrade <Name>" unless the connection string names one, no
	// named prepared statements unless the connection string names an exec
	// mode, and a cancel request to the server when the context ends.
	Tool Purpose = iota + 1
	// Rehearsal is the tool's own SQL run outside a command, on a database
	// of a rehearsal (a replayed apply, the wait probe): pinned as Tool and
	// named Name, with pgx's own exec mode and cancel (a rehearsal goes
	// through no pooler and has no Ctrl-C to honour).
	Rehearsal
	// Test is a session the test harness hands out: pinned as the tool's
	// own, so test SQL that forgets its schema fails, as it would in the
	// tool; pgx's own exec mode and cancel.
	Test
	// Admin is the administrator of a server the tool or its tests run:
	// creating and dropping databases, installing pgmq, pg_cron and the
	// pgflow fixtures, generating rows. Not pinned: the fixture SQL is
	// pgflow's and pgmq's own installation, which creates objects where the
	// server's default search_path puts them.
	Admin
	// Application is a stand-in for the application (the replay's traffic,
	// the 0.16.0 worker simulator, the benchmarks' workers): it connects as
	// the application does, with the database's own search_path, on
	// purpose, since what it rehearses is the application's traffic.
	Application
	// Raw is a connection with nothing added, unpinned on purpose: for a
	// test that proves something about the connection as a client other
	// than the tool gets it (a hostile search_path, a pooler's own console).
	Raw
)

func (p Purpose) String() string {
	switch p {
	case Tool:
		return "tool"
	case Rehearsal:
		return "rehearsal"
	case Test:
		return "test"
	case Admin:
		return "admin"
	case Application:
		return "application"
	case Raw:
		return "raw"
	}
	return fmt.Sprintf("Purpose(%d)", int(p))
}

// pinned says whether sessions of p get SearchPath.
func (p Purpose) pinned() bool { return p == Tool || p == Rehearsal || p == Test }

// Options shape a session beyond its purpose. The zero value of each field
// leaves the purpose's default.
type Options struct {
	Purpose Purpose
	// Name is the session's application_name (what pg_stat_activity
	// shows). For Tool it is "pgflow-upgrade <Name>", and a connection
	// string that names an application_name keeps its own; for the other
	// purposes a non-empty Name replaces the connection string's.
	Name string
	// Settings are run-time settings for the whole session, sent as
	// startup parameters (e.g. lock_timeout).
	Settings map[string]string
	// ExecMode replaces the purpose's exec mode.
	ExecMode pgx.QueryExecMode
	// Tracer traces the session's statements (the pin's own tracer wraps
	// it).
	Tracer pgx.QueryTracer
	// MaxConns bounds a pool (OpenPool only; 0: pgxpool's default).
	MaxConns int32
}

// Config parses connString (an error never quotes it, see ParseConfig) and
// shapes it for o.Purpose. The search_path pin, application_name, exec mode
// and cancel behaviour of every session the tool and its tests open are set
// here and nowhere else.
func Config(connString string, o Options) (*pgx.ConnConfig, error) {
	cfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	shape(cfg, connString, o)
	return cfg, nil
}

// shape applies o to cfg, parsed from connString.
func shape(cfg *pgx.ConnConfig, connString string, o Options) {
	if o.Purpose == 0 {
		panic("session: Options.Purpose not set")
	}
	if o.Tracer != nil {
		cfg.Tracer = o.Tracer
	}
	if o.Purpose.pinned() {
		pin(cfg)
	}
	for name, value := range o.Settings {
		cfg.RuntimeParams[name] = value
	}
	switch {
	case o.Purpose == Tool:
		if _, set := cfg.RuntimeParams["application_name"]; !set {
			cfg.RuntimeParams["application_name"] = strings.TrimSpace("pgflow-upgrade " + o.Name)
		}
	case o.Name != "":
		cfg.RuntimeParams["application_name"] = o.Name
	}
	if o.Purpose == Tool {
		// No named prepared statements (pgx's statement cache): they do not
		// survive a transaction-mode pooler, and no command needs them. A
		// connection string that names an exec mode (simple_protocol for a
		// pooler) keeps it.
		if !strings.Contains(connString, "default_query_exec_mode") {
			cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		}
		// When the context ends (Ctrl-C): send the server a cancel request
		// and wait for its answer, so the running statement is really
		// cancelled (and its transaction rolled back) before the process
		// exits; pgx's default only closes the socket, which can leave the
		// statement running or queued for a lock.
		cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 5 * time.Second}
		}
	}
	if o.ExecMode != 0 {
		cfg.DefaultQueryExecMode = o.ExecMode
	}
}

// Open opens one session to connString for purpose p.
func Open(ctx context.Context, connString string, p Purpose) (*pgx.Conn, error) {
	return OpenWith(ctx, connString, Options{Purpose: p})
}

// OpenWith opens one session to connString shaped by o.
func OpenWith(ctx context.Context, connString string, o Options) (*pgx.Conn, error) {
	cfg, err := Config(connString, o)
	if err != nil {
		return nil, err
	}
	conn, _, err := Connect(ctx, cfg)
	return conn, err
}

// Connect opens one session with cfg, a config from Config. When a pinned
// session is refused because of its search_path startup parameter (a pooler
// such as PgBouncer without track_extra_parameters = search_path), it is
// opened again with the path pinned in each transaction only
// (withoutStartupPin), and perTransaction is true: the caller says so to
// the user.
func Connect(ctx context.Context, cfg *pgx.ConnConfig) (conn *pgx.Conn, perTransaction bool, err error) {
	conn, err = pgx.ConnectConfig(ctx, cfg)
	if err != nil && isPinned(cfg) && isStartupParamRefused(err) && ctx.Err() == nil {
		conn, err = pgx.ConnectConfig(ctx, withoutStartupPin(cfg))
		perTransaction = err == nil
	}
	return conn, perTransaction, err
}

// Reopen opens a new session shaped as conn (same server, settings and
// pin), for work that must go on after conn was closed (pgx closes a
// connection whose statement was cancelled).
func Reopen(ctx context.Context, conn *pgx.Conn) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, conn.Config())
}

// OpenPool opens a pool of sessions to connString shaped by o (MaxConns
// bounds it). A pool is never opened through a pooler that refuses the
// search_path startup parameter: it has no per-transaction fallback.
func OpenPool(ctx context.Context, connString string, o Options) (*pgxpool.Pool, error) {
	if _, err := ParseConfig(connString); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil { // a pool_* parameter pgxpool refuses
		return nil, errors.New(RedactText(err.Error(), connString))
	}
	shape(cfg.ConnConfig, connString, o)
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}
