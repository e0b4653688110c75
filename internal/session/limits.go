package session

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the tool's SQL runs through: a connection, a pool or a
// transaction (*pgx.Conn, *pgxpool.Pool and pgx.Tx satisfy it).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// NoLimit, as a duration of Limits, sets that limit to 0, which PostgreSQL
// reads as "no limit" (a zero duration leaves the setting as it is, any
// other negative one sets the least limit, 1ms).
const NoLimit time.Duration = math.MinInt64

// Limits are the named limits of one transaction. A zero duration leaves
// its setting as it is; any other is set in whole milliseconds, at least
// 1ms (0 would mean no limit); NoLimit sets 0.
type Limits struct {
	Statement         time.Duration // statement_timeout
	Lock              time.Duration // lock_timeout
	IdleInTransaction time.Duration // idle_in_transaction_session_timeout
	// ApplicationName, when not empty, is application_name for the
	// transaction (what pg_stat_activity shows while it runs).
	ApplicationName string
}

// Set applies l to the current transaction of q (to the current savepoint
// when q is one): SET LOCAL semantics, so the settings end with it, which
// keeps them from reaching another client through a transaction pooler.
// One statement, values as parameters. The error is the statement's, as it
// is: callers say what they were setting.
func (l Limits) Set(ctx context.Context, q Querier) error {
	var s locals
	s.limit("statement_timeout", l.Statement)
	s.limit("lock_timeout", l.Lock)
	s.limit("idle_in_transaction_session_timeout", l.IdleInTransaction)
	if l.ApplicationName != "" {
		s.add("application_name", l.ApplicationName)
	}
	return s.exec(ctx, q)
}

// Planner are planner settings of one transaction, for a query whose plan
// the tool chooses itself.
type Planner struct {
	WorkMem   string // work_mem (e.g. "64MB"); empty: as it is
	NoHashAgg bool   // enable_hashagg off: group by sorting
	NoSeqScan bool   // enable_seqscan off: read through an index
}

// Set applies p to the current transaction (or savepoint) of q, like
// Limits.Set.
func (p Planner) Set(ctx context.Context, q Querier) error {
	var s locals
	if p.WorkMem != "" {
		s.add("work_mem", p.WorkMem)
	}
	if p.NoHashAgg {
		s.add("enable_hashagg", "off")
	}
	if p.NoSeqScan {
		s.add("enable_seqscan", "off")
	}
	return s.exec(ctx, q)
}

// EmptySearchPath sets search_path to ” for the current transaction (or
// savepoint) of q: pg_catalog alone is searched, so every text PostgreSQL
// deparses names any other object with its schema.
func EmptySearchPath(ctx context.Context, q Querier) error {
	var s locals
	s.add("search_path", "")
	return s.exec(ctx, q)
}

// SchemaBuildSQL is the statement that opens a transaction building a schema
// from its description: function bodies are not checked
// (check_function_bodies off) and search_path is ”, both for the
// transaction only.
const SchemaBuildSQL = "select pg_catalog.set_config('check_function_bodies', 'off', true), pg_catalog.set_config('search_path', '', true)"

// locals is the set_config calls of one statement.
type locals struct {
	calls []string
	args  []any
}

func (s *locals) add(name, value string) {
	s.args = append(s.args, value)
	// name is one of this file's constants, never user input.
	s.calls = append(s.calls, "pg_catalog.set_config('"+name+"', $"+strconv.Itoa(len(s.args))+", true)")
}

func (s *locals) limit(name string, d time.Duration) {
	switch {
	case d == NoLimit:
		s.add(name, "0")
	case d != 0:
		s.add(name, millis(d))
	}
}

// exec runs the calls in one statement (none: nothing to run).
func (s *locals) exec(ctx context.Context, q Querier) error {
	if len(s.calls) == 0 {
		return nil
	}
	_, err := q.Exec(ctx, "select "+strings.Join(s.calls, ", "), s.args...)
	return err
}

// millis formats d for a timeout setting, at least 1ms (0 would mean "no
// limit").
func millis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms"
}

// SetLocal sets one run-time setting for the current transaction (or
// savepoint) of q only, like Limits.Set, for a setting the tool does not
// name itself (an application's own, such as app.settings.jwt_secret).
// Name and value travel as parameters.
func SetLocal(ctx context.Context, q Querier, name, value string) error {
	_, err := q.Exec(ctx, "select pg_catalog.set_config($1, $2, true)", name, value)
	return err
}
