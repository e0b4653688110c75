package session

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestMillis(t *testing.T) {
	if got := millis(0); got != "1ms" {
		t.Fatalf("millis(0) = %s", got)
	}
	if got := millis(2 * time.Second); got != "2000ms" {
		t.Fatalf("millis(2s) = %s", got)
	}
}

// recorder is a Querier that records what Exec was given.
type recorder struct {
	sql  []string
	args [][]any
}

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = append(r.sql, sql), append(r.args, args)
	return pgconn.CommandTag{}, nil
}
func (r *recorder) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, nil }
func (r *recorder) QueryRow(context.Context, string, ...any) pgx.Row        { return nil }

func TestLimitsSet(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(context.Context, Querier) error
		sql  string
		args []any
	}{
		{"all", Limits{Statement: 90 * time.Second, Lock: -time.Second, IdleInTransaction: 6 * time.Second, ApplicationName: "app"}.Set,
			"select pg_catalog.set_config('statement_timeout', $1, true), pg_catalog.set_config('lock_timeout', $2, true), " +
				"pg_catalog.set_config('idle_in_transaction_session_timeout', $3, true), pg_catalog.set_config('application_name', $4, true)",
			[]any{"90000ms", "1ms", "6000ms", "app"}},
		{"no statement limit", Limits{Lock: time.Minute, Statement: NoLimit}.Set,
			"select pg_catalog.set_config('statement_timeout', $1, true), pg_catalog.set_config('lock_timeout', $2, true)",
			[]any{"0", "60000ms"}},
		{"planner", Planner{WorkMem: "64MB", NoHashAgg: true}.Set,
			"select pg_catalog.set_config('work_mem', $1, true), pg_catalog.set_config('enable_hashagg', $2, true)",
			[]any{"64MB", "off"}},
		{"search path", EmptySearchPath,
			"select pg_catalog.set_config('search_path', $1, true)", []any{""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &recorder{}
			if err := c.set(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if len(r.sql) != 1 || r.sql[0] != c.sql || !reflect.DeepEqual(r.args[0], c.args) {
				t.Fatalf("ran %q %v\nwant %q %v", r.sql, r.args, c.sql, c.args)
			}
		})
	}
	r := &recorder{}
	if err := (Limits{}).Set(context.Background(), r); err != nil || len(r.sql) != 0 {
		t.Fatalf("no limit: ran %q (%v)", r.sql, err)
	}
}
