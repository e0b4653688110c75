package session

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// SearchPath is the search_path of every session the tool opens. pg_catalog
// comes first so built-ins are found before anything else, and pg_temp is
// listed after it: left out, pg_temp would be searched first for relations
// and types. No schema a less-privileged role can write is in it, so a
// function, aggregate, operator, type or view named like a built-in
// (CVE-2018-1058) is never resolved, whatever its argument types: the tool's
// SQL reaches pgflow, pgmq and its own schema by qualified names only.
const SearchPath = "pg_catalog, pg_temp"

// pinSQL re-asserts SearchPath for the current transaction only.
const pinSQL = "select pg_catalog.set_config('search_path', '" + SearchPath + "', true)"

// ClientCheckInterval is client_connection_check_interval in every
// transaction the tool opens on PostgreSQL 14 and later: while a statement
// runs, the backend checks this often whether the client is still there, so
// the backend of a killed client (kill -9, a lost network) stops and
// releases its locks about this long after the client died, plus the time
// to abort on a busy server, instead of running the statement (a table
// rewrite under ACCESS EXCLUSIVE) to its end. A check is one poll() of the
// socket when a timer fires, nothing measurable next to the statement, so
// the interval is short enough that the locks go well within a second even
// when the server is busy. Between statements no check is needed: an idle
// backend reads the socket and sees it close at once.
const ClientCheckInterval = "100ms"

// pinSQL14 is pinSQL with ClientCheckInterval (PostgreSQL 14+).
const pinSQL14 = "select pg_catalog.set_config('search_path', '" + SearchPath + "', true), " +
	"pg_catalog.set_config('client_connection_check_interval', '" + ClientCheckInterval + "', true)"

// pin makes every session opened with cfg use SearchPath (Config calls it
// for the pinned purposes; a second call changes nothing):
//
//   - as a startup parameter: it is applied after the DSN's `options` (so
//     options=-csearch_path=... loses) and takes precedence over ALTER ROLE
//     and ALTER DATABASE settings;
//   - again at the start of every transaction (set_config(..., true) right
//     after BEGIN), for the sessions where the startup parameter cannot be
//     used (a pooler that refuses it, see withoutStartupPin) and so that a
//     session-level SET earlier on the connection cannot carry over.
//
// A search_path given in the DSN itself is overridden.
func pin(cfg *pgx.ConnConfig) {
	cfg.RuntimeParams["search_path"] = SearchPath
	if _, done := cfg.Tracer.(*pinTracer); !done {
		cfg.Tracer = &pinTracer{next: cfg.Tracer}
	}
}

// isPinned says whether cfg is pinned (by pin).
func isPinned(cfg *pgx.ConnConfig) bool {
	_, ok := cfg.Tracer.(*pinTracer)
	return ok
}

// isStartupParamRefused says whether a connection failed because the server
// (in practice a pooler such as PgBouncer without track_extra_parameters =
// search_path) refused the search_path startup parameter.
func isStartupParamRefused(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.Contains(pgErr.Message, "unsupported startup parameter") && strings.Contains(pgErr.Message, "search_path")
	}
	return err != nil && strings.Contains(err.Error(), "unsupported startup parameter: search_path")
}

// withoutStartupPin is cfg for a pooler that refuses the search_path startup
// parameter: the path is then set in every transaction only. No session SET:
// through a transaction pooler it would stay on the server session and reach
// the application's clients. Statements outside a transaction run with the
// path of whichever server session the pooler hands out; the tool's own SQL
// names every schema, and the pooler should pass search_path (PgBouncer:
// track_extra_parameters = search_path) to close that gap.
func withoutStartupPin(cfg *pgx.ConnConfig) *pgx.ConnConfig {
	c := cfg.Copy()
	delete(c.RuntimeParams, "search_path")
	return c
}

// pinTracer re-asserts SearchPath after every BEGIN the connection runs
// (pgx's Begin sends it through Exec, so every transaction passes here).
type pinTracer struct{ next pgx.QueryTracer }

type beginKey struct{}

// pinTimeout bounds the re-assertion (one set_config round trip) when the
// caller's context has just been cancelled.
const pinTimeout = 10 * time.Second

func (p *pinTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if p.next != nil {
		ctx = p.next.TraceQueryStart(ctx, conn, data)
	}
	if isBegin(data.SQL) {
		ctx = context.WithValue(ctx, beginKey{}, true)
	}
	return ctx
}

func (p *pinTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if p.next != nil {
		p.next.TraceQueryEnd(ctx, conn, data)
	}
	if data.Err != nil || ctx.Value(beginKey{}) == nil {
		return
	}
	if tag := data.CommandTag.String(); tag != "BEGIN" && tag != "START TRANSACTION" {
		return
	}
	pinCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pinTimeout)
	defer cancel()
	sql := pinSQL
	if serverMajor(conn.PgConn()) >= 14 {
		sql = pinSQL14
	}
	if _, err := conn.Exec(pinCtx, sql); err != nil {
		// A transaction whose path could not be pinned must not go on:
		// closing the connection makes the caller's next statement fail.
		_ = conn.PgConn().Close(pinCtx)
	}
}

// serverMajor is the server's major version (0 when unknown).
func serverMajor(pc *pgconn.PgConn) int {
	v := pc.ParameterStatus("server_version")
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// isBegin says whether sql opens a transaction (BEGIN or START TRANSACTION,
// as pgx's Begin sends it, with its options).
func isBegin(sql string) bool {
	s := strings.ToLower(strings.TrimSpace(sql))
	return strings.HasPrefix(s, "begin") || strings.HasPrefix(s, "start transaction")
}
