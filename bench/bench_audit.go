package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// The audit answers exactly: its one full-table check (duplicate (queue,
// message id) pairs over step_tasks) must come back inside its default
// budget at 5M rows. Measured beside the raw floor, one GROUP BY over
// lower(flow_slug), message_id with the server's default settings.
func init() {
	Register(Benchmark{
		Name: "audit",
		Goal: "exact audit at 1M and 5M step_tasks rows, tasks.duplicate_message_id inside its default per-check budget (30 s), beside one raw GROUP BY",
		Run:  benchAudit,
	})
}

// RawDuplicateSQL is the floor: the duplicate question as one statement.
const RawDuplicateSQL = `select pg_catalog.count(*) from (
  select pg_catalog.lower(flow_slug), message_id from pgflow.step_tasks
  where message_id is not null group by 1, 2 having pg_catalog.count(*) > 1) d`

// AuditTimes are one measurement of the audit on a database.
type AuditTimes struct {
	Raw       time.Duration // RawDuplicateSQL
	Duplicate time.Duration // audit.Run with tasks.duplicate_message_id only
	Whole     time.Duration // audit.Run with every check
	Status    audit.Status  // of tasks.duplicate_message_id in the whole audit
}

// MeasureAudit measures dsn once, each part on a fresh connection.
func MeasureAudit(ctx context.Context, dsn string) (AuditTimes, error) {
	var m AuditTimes
	timed := func(fn func(conn *pgx.Conn) error) (time.Duration, error) {
		conn, err := session.Open(ctx, dsn, session.Rehearsal)
		if err != nil {
			return 0, err
		}
		defer conn.Close(ctx)
		start := time.Now()
		err = fn(conn)
		return time.Since(start), err
	}
	var err error
	if m.Raw, err = timed(func(conn *pgx.Conn) error {
		var n int64
		return conn.QueryRow(ctx, RawDuplicateSQL).Scan(&n)
	}); err != nil {
		return m, fmt.Errorf("raw GROUP BY: %w", err)
	}
	check := func(rep *audit.Report) error {
		for _, r := range rep.Checks {
			if r.ID == "tasks.duplicate_message_id" {
				m.Status = r.Status
				if r.Status != audit.StatusOK {
					return fmt.Errorf("tasks.duplicate_message_id: %s %s", r.Status, r.Error)
				}
			}
		}
		return nil
	}
	if m.Duplicate, err = timed(func(conn *pgx.Conn) error {
		rep, err := audit.Run(ctx, conn, audit.Options{Checks: []string{"tasks.duplicate_message_id"}})
		if err != nil {
			return err
		}
		return check(rep)
	}); err != nil {
		return m, fmt.Errorf("audit, duplicate check: %w", err)
	}
	if m.Whole, err = timed(func(conn *pgx.Conn) error {
		rep, err := audit.Run(ctx, conn, audit.Options{})
		if err != nil {
			return err
		}
		return check(rep)
	}); err != nil {
		return m, fmt.Errorf("audit, every check: %w", err)
	}
	return m, nil
}

func benchAudit(ctx context.Context, env *Env) ([]Row, error) {
	var rows []Row
	for _, size := range env.Sizes {
		dsn, drop, err := env.Clone(ctx, size)
		if err != nil {
			return nil, err
		}
		var raw, dup, whole []time.Duration
		for i := 0; i < env.Repeat; i++ {
			m, err := MeasureAudit(ctx, dsn)
			if err != nil {
				drop()
				return nil, fmt.Errorf("audit at %d rows: %w", size, err)
			}
			raw, dup, whole = append(raw, m.Raw), append(dup, m.Duplicate), append(whole, m.Whole)
		}
		drop()
		rows = append(rows, Row{Benchmark: "audit", Case: fmt.Sprintf("%d step_tasks", size), Metrics: []Metric{
			{"raw GROUP BY", Median(raw).Seconds(), "s"},
			{"duplicate check", Median(dup).Seconds(), "s"},
			{"whole audit", Median(whole).Seconds(), "s"},
		}})
	}
	return rows, nil
}
