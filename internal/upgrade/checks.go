// Package upgrade implements `pgflow-upgrade apply`, `status` and `verify`:
// the queue-persistence migration run safely in one transaction, and the
// read-only questions asked before and after it.
package upgrade

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the read-only checks need: a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Check is one post-upgrade condition: a catalog query that returns
// (ok boolean, detail text). The same list is the post-condition of `apply`
// (inside its transaction, before commit) and the body of `verify`.
type Check struct {
	ID    string
	Title string
	// SQL returns one row (ok boolean, detail text). It must be cheap: in
	// `apply` it runs while step_tasks is ACCESS EXCLUSIVE locked.
	SQL string
}

// CheckOutcome is the result of one Check.
type CheckOutcome struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// notNullColumn asks whether pgflow.<table>.queue_name exists and is NOT NULL.
func notNullColumn(table string) string {
	return `select coalesce(bool_and(a.attnotnull), false),
	               case when count(*) = 0 then 'column missing'
	                    when bool_and(a.attnotnull) then 'not null'
	                    else 'nullable' end
	          from pg_catalog.pg_attribute a
	         where a.attrelid = pg_catalog.to_regclass('pgflow.` + table + `')
	           and a.attname = 'queue_name' and not a.attisdropped`
}

// functionPresent asks whether a function with exactly this signature exists.
func functionPresent(signature string) string {
	return `select pg_catalog.to_regprocedure('` + signature + `') is not null,
	               case when pg_catalog.to_regprocedure('` + signature + `') is null then 'missing' else 'present' end`
}

// functionGone asks whether a function with this signature no longer exists.
func functionGone(signature string) string {
	return `select pg_catalog.to_regprocedure('` + signature + `') is null,
	               case when pg_catalog.to_regprocedure('` + signature + `') is null then 'gone' else 'still present: 0.16.0 workers are not fenced' end`
}

// uniqueIndex asks whether pgflow.<table> has a valid unique index whose
// definition (after "USING btree") matches the pattern.
func uniqueIndex(table, pattern string) string {
	return `select count(*) > 0,
	               coalesce(string_agg(c.relname, ', '), 'no valid unique index matching ` + pattern + `')
	          from pg_catalog.pg_index i
	          join pg_catalog.pg_class c on c.oid = i.indexrelid
	         where i.indrelid = pg_catalog.to_regclass('pgflow.` + table + `')
	           and i.indisunique and i.indisvalid
	           and pg_catalog.pg_get_indexdef(i.indexrelid) ~ '` + pattern + `'`
}

// Checks is the list behind `verify` and apply's post-conditions. Every
// identifier is a constant of this file; nothing user-supplied is spliced.
func Checks() []Check {
	return []Check{
		{ID: "flows_queue_name_not_null", Title: "pgflow.flows.queue_name exists and is NOT NULL", SQL: notNullColumn("flows")},
		{ID: "step_tasks_queue_name_not_null", Title: "pgflow.step_tasks.queue_name exists and is NOT NULL", SQL: notNullColumn("step_tasks")},
		// flows is small, so its rows are checked too; for step_tasks the
		// validated NOT NULL constraint above is the proof (a scan would
		// only lengthen apply's ACCESS EXCLUSIVE window).
		{ID: "flows_queue_name_backfilled", Title: "every flow has a queue_name", SQL: `
			select not exists (select 1 from pgflow.flows f where f.queue_name is null),
			       (select count(*) filter (where f.queue_name is null) || ' flows without queue_name' from pgflow.flows f)`},
		{ID: "step_tasks_unique_address", Title: "unique (queue_name, message_id) on pgflow.step_tasks",
			SQL: uniqueIndex("step_tasks", `\(queue_name, message_id\)`)},
		{ID: "flows_unique_lower_slug", Title: "flow slugs unique case-insensitively",
			SQL: uniqueIndex("flows", `\(lower\(flow_slug\)\)`)},
		{ID: "flows_unique_queue_name", Title: "one flow per queue (unique queue_name)",
			SQL: uniqueIndex("flows", `\(queue_name\)$`)},
		{ID: "schema_revision_recorded", Title: "pgflow.schema_revisions records " + Version, SQL: `
			select exists (select 1 from pgflow.schema_revisions r where r.version = '` + Version + `'), 'checked'`},
		{ID: "claim_tasks_present", Title: "pgflow.claim_tasks present",
			SQL: functionPresent("pgflow.claim_tasks(text, uuid, integer, integer, integer, integer)")},
		{ID: "ensure_flow_compiled_3_present", Title: "pgflow.ensure_flow_compiled(text, jsonb, boolean) present",
			SQL: functionPresent("pgflow.ensure_flow_compiled(text, jsonb, boolean)")},
		{ID: "complete_task_present", Title: "pgflow.complete_task present",
			SQL: functionPresent("pgflow.complete_task(uuid, text, integer, jsonb)")},
		{ID: "fail_task_present", Title: "pgflow.fail_task present",
			SQL: functionPresent("pgflow.fail_task(uuid, text, integer, text)")},
		{ID: "release_task_present", Title: "pgflow.release_task present",
			SQL: functionPresent("pgflow.release_task(uuid, text, integer, uuid)")},
		// A missing function fails the query at parse time: reported as failed.
		{ID: "protocol_version_2", Title: "pgflow.queue_protocol_version() = 2", SQL: `
			select pgflow.queue_protocol_version() = 2, 'returns ' || pgflow.queue_protocol_version()::text`},
		{ID: "old_ensure_flow_compiled_gone", Title: "0.16.0 ensure_flow_compiled(text, jsonb) gone (fence)",
			SQL: functionGone("pgflow.ensure_flow_compiled(text,jsonb)")},
		{ID: "old_start_tasks_gone", Title: "0.16.0 start_tasks(text, bigint[], uuid) gone (fence)",
			SQL: functionGone("pgflow.start_tasks(text,bigint[],uuid)")},
		// The review asked for no trigger on the step_tasks hot path.
		{ID: "no_step_tasks_trigger", Title: "no trigger on pgflow.step_tasks (hot path)", SQL: `
			select count(*) = 0, coalesce(string_agg(t.tgname, ', '), 'none')
			  from pg_catalog.pg_trigger t
			 where t.tgrelid = pg_catalog.to_regclass('pgflow.step_tasks') and not t.tgisinternal`},
	}
}

// RunChecks runs every check. A check whose query fails is reported as
// failed with the error; only a broken connection or a cancelled context
// (errors the next check would hit too) stops the run.
//
// Inside apply's transaction a failing query would abort the transaction,
// so each check there runs under its own savepoint (inTx).
func RunChecks(ctx context.Context, q Querier, inTx bool) ([]CheckOutcome, error) {
	var out []CheckOutcome
	for _, c := range Checks() {
		o := CheckOutcome{ID: c.ID, Title: c.Title}
		if inTx {
			if _, err := q.Exec(ctx, "savepoint pgflow_upgrade_check"); err != nil {
				return out, fmt.Errorf("check %s: savepoint: %w", c.ID, err)
			}
		}
		err := q.QueryRow(ctx, c.SQL).Scan(&o.OK, &o.Detail)
		if err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("check %s: %w", c.ID, ctx.Err())
			}
			o.OK = false
			o.Detail = "query failed: " + err.Error()
		}
		if inTx {
			stmt := "release savepoint pgflow_upgrade_check"
			if err != nil {
				stmt = "rollback to savepoint pgflow_upgrade_check"
			}
			if _, err := q.Exec(ctx, stmt); err != nil {
				return out, fmt.Errorf("check %s: %s: %w", c.ID, stmt, err)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// Failed returns the outcomes that did not pass.
func Failed(outcomes []CheckOutcome) []CheckOutcome {
	var bad []CheckOutcome
	for _, o := range outcomes {
		if !o.OK {
			bad = append(bad, o)
		}
	}
	return bad
}
