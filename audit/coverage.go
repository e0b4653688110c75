package audit

import (
	"context"
	"errors"
	"fmt"
)

// Coverage says how much of a table a check decided before it stopped: an
// inconclusive check that was reading a table reports it, so "not proven"
// carries how far it got ("examined N of about M rows").
type Coverage struct {
	Table    string `json:"table"`    // e.g. "pgflow.step_tasks"
	Examined int64  `json:"examined"` // rows the check decided (exact)
	// Estimated is the table's size from the statistics (pg_class.reltuples,
	// narrowed to the rows the check looks at when pg_stats says how many);
	// -1: never analyzed, unknown.
	Estimated int64 `json:"estimated"`
}

func (c Coverage) String() string {
	if c.Estimated < 0 {
		return fmt.Sprintf("examined %d rows of %s (its size is unknown: never analyzed)", c.Examined, c.Table)
	}
	return fmt.Sprintf("examined %d of about %d rows of %s", c.Examined, c.Estimated, c.Table)
}

// PartialError is a check stopped part-way through a table: Cause says why
// (a timeout makes the check inconclusive), Coverage how far it got.
type PartialError struct {
	Coverage Coverage
	Cause    error
}

// Error is the cause's: the runner puts the coverage in front of it
// (CheckResult.Error, "inconclusive: examined N of about M rows ...").
func (e *PartialError) Error() string { return e.Cause.Error() }

func (e *PartialError) Unwrap() error { return e.Cause }

// estimateRows is the planner's row estimate of pgflow.<table> (-1 when
// never analyzed). Catalog only: no lock on the table.
func estimateRows(ctx context.Context, q Querier, table string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `
		select coalesce((select c.reltuples::bigint from pg_catalog.pg_class c
		                 join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgflow'
		                 where c.relname = $1 and c.relkind in ('r', 'p')), -1)`, table).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("estimating the rows of pgflow.%s: %w", table, err)
	}
	return n, nil
}

// scanTable runs fn, a check's reading of pgflow.<table>, and turns its
// failure into a *PartialError with the table's estimated size. examined
// tells how many rows fn had decided when it stopped (0 for a single
// statement: a statement that is cancelled decides nothing).
func scanTable(ctx context.Context, q Querier, table string, fn func(estimate int64) (examined int64, err error)) error {
	est, err := estimateRows(ctx, q, table)
	if err != nil {
		return err
	}
	examined, err := fn(est)
	if err == nil {
		return nil
	}
	var pe *PartialError
	if errors.As(err, &pe) {
		return err
	}
	return &PartialError{Coverage: Coverage{Table: "pgflow." + table, Examined: examined, Estimated: est}, Cause: err}
}
