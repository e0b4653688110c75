package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// PrivilegesCheckID is the ID of the privileges check (not in audit's
// catalog: only apply needs to write).
const PrivilegesCheckID = "apply.privileges"

// privilegesRemedy says what to do about a finding.
const privilegesRemedy = "Run apply as the role that owns the pgflow schema objects (on Supabase: postgres), " +
	"or grant that role to the one you use (GRANT <owner> TO <role>)."

// PrivilegesCheck is a Check in audit's shape so its findings print and
// serialize like the catalog's. The migration alters the pgflow tables,
// replaces and drops pgflow functions and creates objects in schema pgflow,
// which takes ownership (or superuser) and CREATE on the schema; recording
// the revision for the Supabase CLI takes INSERT on its table. Apply runs
// it before the locks (through Privileges, every object named) and again
// with the preflight under them.
func PrivilegesCheck() audit.Check {
	return audit.Check{
		ID:       PrivilegesCheckID,
		Title:    "the role running apply may alter the pgflow schema",
		Severity: audit.Blocker,
		Meaning:  "the migration would fail half-way with permission denied",
		Remedy:   privilegesRemedy,
		Runs:     audit.BeforeLocks | audit.UnderLocks,
		Needs:    audit.NeedsPgflow,
		Run: func(ctx context.Context, _ audit.Check, q audit.Querier, env audit.Env) ([]audit.Finding, error) {
			return Privileges(ctx, q, env.Sample)
		},
	}
}

// Privileges lists what the current role lacks. It reads the catalog only.
// sample bounds the sample rows (0: none; negative: all).
func Privileges(ctx context.Context, q audit.Querier, sample int) ([]audit.Finding, error) {
	rows, err := q.Query(ctx, `
		with ns as (select pg_catalog.to_regnamespace('pgflow') as oid)
		select 'not the owner of table' as problem, 'pgflow.' || c.relname as object
		  from pg_catalog.pg_class c, ns
		 where c.relnamespace = ns.oid and c.relkind in ('r', 'p')
		   and not pg_catalog.pg_has_role(c.relowner, 'USAGE')
		union all
		select 'not the owner of function', p.oid::pg_catalog.regprocedure::text
		  from pg_catalog.pg_proc p, ns
		 where p.pronamespace = ns.oid
		   and not pg_catalog.pg_has_role(p.proowner, 'USAGE')
		union all
		select 'no CREATE privilege on schema', 'pgflow'
		  from ns
		 where ns.oid is not null and not pg_catalog.has_schema_privilege(ns.oid, 'CREATE')
		union all
		-- The ledger is found through pg_class, not to_regclass: a role
		-- without USAGE on its schema gets a finding, not an error.
		select 'no INSERT privilege on table', 'supabase_migrations.schema_migrations'
		  from pg_catalog.pg_class c
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'supabase_migrations'
		 where c.relname = 'schema_migrations'
		   and not pg_catalog.has_table_privilege(c.oid, 'INSERT')
		union all
		select 'no USAGE privilege on schema', 'supabase_migrations'
		  from pg_catalog.pg_namespace n
		 where n.nspname = 'supabase_migrations'
		   and exists (select 1 from pg_catalog.pg_class c where c.relnamespace = n.oid and c.relname = 'schema_migrations')
		   and not pg_catalog.has_schema_privilege(n.oid, 'USAGE')
		order by 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("reading the privileges of the current role: %w", err)
	}
	type lack struct{ Problem, Object string }
	lacks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lack])
	if err != nil {
		return nil, fmt.Errorf("reading the privileges of the current role: %w", err)
	}
	if len(lacks) == 0 {
		return nil, nil
	}
	var samples []map[string]any
	var objects []string
	for i, l := range lacks {
		if sample < 0 || i < sample {
			samples = append(samples, map[string]any{"problem": l.Problem, "object": l.Object})
		}
		if i < 5 {
			objects = append(objects, l.Object)
		}
	}
	more := ""
	if len(lacks) > len(objects) {
		more = ", ..."
	}
	return []audit.Finding{{
		CheckID:  PrivilegesCheckID,
		Severity: audit.Blocker,
		Count:    int64(len(lacks)),
		Message:  fmt.Sprintf("the current role cannot change %d object(s) the migration changes: %s%s", len(lacks), strings.Join(objects, ", "), more),
		Remedy:   privilegesRemedy,
		Samples:  samples,
	}}, nil
}
