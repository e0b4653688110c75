package audit

import (
	"context"
	"fmt"
	"time"
)

// seconds of d, or def when d is unset.
func seconds(d time.Duration, def float64) float64 {
	if d <= 0 {
		return def
	}
	return d.Seconds()
}

// sessionsLongTransactions is sessions.long_transactions.
var sessionsLongTransactions = Check{
	ID: "sessions.long_transactions", Title: "long and idle-in-transaction sessions", Severity: Warning, Runs: InAudit,
	Meaning: "Transactions open for more than 30 s, or idle in transaction for more than 10 s, in this database: apply's table locks wait behind their locks " +
		"and apply gives up after its lock timeout. Without pg_read_all_stats (or pg_monitor) other roles' sessions are invisible; that is reported as info.",
	Remedy: "Finish or terminate them (select pg_terminate_backend(pid)) before apply; find the client by application_name.",
	Run:    checkLongTransactions,
}

func checkLongTransactions(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var n, hidden int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with a as materialized (
		  select a.pid, a.usename, a.application_name, a.state, a.xact_start, a.state_change, a.wait_event_type, a.query
		  from pg_catalog.pg_stat_activity a
		  where a.datname = pg_catalog.current_database() and a.pid <> pg_catalog.pg_backend_pid()
		    and coalesce(a.backend_type, 'client backend') = 'client backend' -- null: hidden from this role
		),
		l as (
		  select * from a
		  where a.xact_start < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
		     or (a.state like 'idle in transaction%' and a.state_change < pg_catalog.now() - pg_catalog.make_interval(secs => $3))
		)
		select (select pg_catalog.count(*) from l),
		       (select pg_catalog.count(*) from a where a.query = '<insufficient privilege>'),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'user', l.usename, 'application_name', l.application_name,
		                  'state', l.state, 'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)),
		                  'state_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.state_change)),
		                  'wait_event_type', l.wait_event_type, 'query', pg_catalog.left(l.query, 120))
		         from l order by l.xact_start limit $1))`, env.Sample, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)).Scan(&n, &hidden, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	var out []Finding
	if n > 0 {
		out = append(out, c.finding(n, fmt.Sprintf("%d session(s) with a transaction open over %gs or idle in transaction over %gs",
			n, seconds(env.LongTransaction, 30), seconds(env.IdleInTransaction, 10)), samples))
	}
	if hidden > 0 {
		f := c.finding(hidden, fmt.Sprintf("%d session(s) of other roles are not visible to this role (their state and transaction age are hidden)", hidden), nil)
		f.Severity, f.Remedy = Info, "Run the audit as a role with pg_read_all_stats (or pg_monitor) to see every session."
		out = append(out, f)
	}
	return out, nil
}

// sessionsLocksOnPgflow is sessions.locks_on_pgflow.
var sessionsLocksOnPgflow = Check{
	ID: "sessions.locks_on_pgflow", Title: "locks held on pgflow tables", Severity: Warning, Runs: InAudit,
	Meaning: "Locks other sessions hold or wait for on pgflow tables: strong modes (above ROW EXCLUSIVE), waits, or any lock of a transaction older than 5 s. " +
		"apply needs ACCESS EXCLUSIVE on flows, steps and step_tasks and would wait behind them (up to its lock timeout per try).",
	Remedy: "Let the holders finish, or stop them (select pg_terminate_backend(pid)), before apply.",
	Run:    checkLocksOnPgflow,
}

func checkLocksOnPgflow(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var n int64
	var samples []map[string]any
	err := q.QueryRow(ctx, `
		with l as materialized (
		  select l.pid, l.mode, l.granted, c.relname::text as relname, a.usename, a.application_name, a.state, a.xact_start
		  from pg_catalog.pg_locks l
		  join pg_catalog.pg_class c on c.oid = l.relation
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgflow'
		  left join pg_catalog.pg_stat_activity a on a.pid = l.pid
		  where l.locktype = 'relation'
		    and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = pg_catalog.current_database())
		    and l.pid <> pg_catalog.pg_backend_pid()
		    and (l.mode not in ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
		         or not l.granted
		         or a.xact_start < pg_catalog.now() - interval '5 seconds')
		)
		select (select pg_catalog.count(*) from l),
		       pg_catalog.to_jsonb(array(
		         select pg_catalog.jsonb_build_object('pid', l.pid, 'table', 'pgflow.' || l.relname, 'mode', l.mode, 'granted', l.granted,
		                  'user', l.usename, 'application_name', l.application_name, 'state', l.state,
		                  'xact_age_s', pg_catalog.round(extract(epoch from pg_catalog.now() - l.xact_start)))
		         from l order by l.granted desc, l.xact_start nulls last, l.pid limit $1))`, env.Sample).Scan(&n, &samples)
	if err != nil {
		return nil, fmt.Errorf("reading pg_locks: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d lock(s) on pgflow tables that apply would wait behind", n), samples)}, nil
}
