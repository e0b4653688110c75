package audit

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// SchemaState is the detected shape of the pgflow schema.
type SchemaState string

const (
	StateBaseline  SchemaState = "baseline"   // pgflow 0.16.0, not upgraded
	StateUpgraded  SchemaState = "upgraded"   // upstream 0.17.0 (queue identity, step queues)
	StatePartial   SchemaState = "partial"    // pgflow tables, but neither shape exactly
	StateUnknown   SchemaState = "unknown"    // a pgflow schema without the pgflow tables
	StateNotPgflow SchemaState = "not_pgflow" // no schema pgflow
)

// SchemaInfo is what DetectSchema found.
type SchemaInfo struct {
	State SchemaState `json:"state"`
	// HasTables: the tables the data checks read exist (flows, steps, runs,
	// step_states, step_tasks, workers).
	HasTables bool `json:"has_tables"`
	// Differences from the expected shape (empty for baseline and upgraded).
	Differences []string `json:"differences"`
}

// PGMQInfo says which pgmq a database has.
type PGMQInfo struct {
	Installed bool `json:"installed"`
	// Kind: "extension" (CREATE EXTENSION pgmq) or "schema" (a pgmq schema
	// that is not an extension, e.g. installed from SQL), "" when absent.
	Kind    string `json:"kind"`
	Version string `json:"version"` // extversion, "" for a schema install
}

func (p PGMQInfo) String() string {
	switch {
	case !p.Installed:
		return "not installed"
	case p.Kind == "extension":
		return "extension " + p.Version
	}
	return "schema pgmq (not an extension)"
}

// DetectPGMQ reads pg_extension, pg_namespace and pg_proc (catalog rows
// only: no USAGE on schema pgmq needed). Installed needs pgmq.list_queues()
// too, since the queue checks call it.
func DetectPGMQ(ctx context.Context, q Querier) (PGMQInfo, error) {
	var info PGMQInfo
	var ext, schema, listQueues bool
	var version *string
	err := q.QueryRow(ctx, `
		select exists (select 1 from pg_catalog.pg_extension where extname = 'pgmq'),
		       (select e.extversion from pg_catalog.pg_extension e where e.extname = 'pgmq'),
		       exists (select 1 from pg_catalog.pg_namespace where nspname = 'pgmq'),
		       exists (select 1 from pg_catalog.pg_proc p
		               join pg_catalog.pg_namespace n on n.oid = p.pronamespace and n.nspname = 'pgmq'
		               where p.proname = 'list_queues' and p.pronargs = 0)`).Scan(&ext, &version, &schema, &listQueues)
	if err != nil {
		return info, fmt.Errorf("detecting pgmq: %w", err)
	}
	switch {
	case ext:
		info.Kind = "extension"
		if version != nil {
			info.Version = *version
		}
	case schema:
		info.Kind = "schema"
	}
	info.Installed = info.Kind != "" && listQueues
	return info, nil
}

// The 0.16.0 baseline: tables with the columns (and types) the upgrade and
// the checks rely on, and functions by signature.
var baselineColumns = map[string][][2]string{
	"flows": {{"flow_slug", "text"}, {"opt_max_attempts", "integer"}, {"opt_base_delay", "integer"},
		{"opt_timeout", "integer"}, {"created_at", "timestamp with time zone"}},
	"steps": {{"flow_slug", "text"}, {"step_slug", "text"}, {"step_type", "text"}, {"step_index", "integer"},
		{"deps_count", "integer"}, {"opt_max_attempts", "integer"}, {"opt_base_delay", "integer"},
		{"opt_timeout", "integer"}, {"opt_start_delay", "integer"}},
	"deps": {{"flow_slug", "text"}, {"dep_slug", "text"}, {"step_slug", "text"}},
	"runs": {{"run_id", "uuid"}, {"flow_slug", "text"}, {"status", "text"}, {"input", "jsonb"},
		{"output", "jsonb"}, {"remaining_steps", "integer"}, {"started_at", "timestamp with time zone"},
		{"completed_at", "timestamp with time zone"}, {"failed_at", "timestamp with time zone"}},
	"step_states": {{"flow_slug", "text"}, {"run_id", "uuid"}, {"step_slug", "text"}, {"status", "text"},
		{"remaining_tasks", "integer"}, {"initial_tasks", "integer"}, {"remaining_deps", "integer"}},
	"step_tasks": {{"flow_slug", "text"}, {"run_id", "uuid"}, {"step_slug", "text"}, {"message_id", "bigint"},
		{"task_index", "integer"}, {"status", "text"}, {"attempts_count", "integer"}, {"error_message", "text"},
		{"output", "jsonb"}, {"queued_at", "timestamp with time zone"}, {"started_at", "timestamp with time zone"},
		{"completed_at", "timestamp with time zone"}, {"failed_at", "timestamp with time zone"},
		{"last_worker_id", "uuid"}, {"requeued_count", "integer"}, {"permanently_stalled_at", "timestamp with time zone"}},
	"workers": {{"worker_id", "uuid"}, {"queue_name", "text"}, {"function_name", "text"},
		{"started_at", "timestamp with time zone"}, {"last_heartbeat_at", "timestamp with time zone"},
		{"deprecated_at", "timestamp with time zone"}, {"stopped_at", "timestamp with time zone"}},
	"worker_functions": {{"function_name", "text"}},
}

// dataTables are the tables the data checks read.
var dataTables = []string{"flows", "steps", "runs", "step_states", "step_tasks", "workers"}

// Functions both shapes have (name(argtypes) as oidvectortypes prints them).
var commonFunctions = []string{
	"create_flow(text, integer, integer, integer)",
	"add_step(text, text, text[], integer, integer, integer, integer, text, jsonb, jsonb, text, text)",
	"start_flow(text, jsonb, uuid)",
	"complete_task(uuid, text, integer, jsonb)",
	"fail_task(uuid, text, integer, text)",
	"delete_flow_and_data(text)",
}

// The 0.16.0 worker protocol: present before, dropped by the 0.17.0
// migration (which is what fences 0.16.0 workers off).
var legacyFunctions = []string{
	"ensure_flow_compiled(text, jsonb)",
	"start_tasks(text, bigint[], uuid)",
}

// What upstream's 0.17.0 migration adds (the queue identity columns and
// the new worker protocol). The tool's own bookkeeping lives in its own
// schema, never in pgflow, so there is no table here.
var upgradeColumns = [][2]string{{"flows", "queue_mode"}, {"steps", "queue_name"}, {"step_tasks", "queue_name"}}
var upgradeTables = []string{}
var upgradeFunctions = []string{
	"is_valid_queue_name(text)",
	"ensure_flow_compiled(text, jsonb, text, jsonb)",
	"start_tasks(text, bigint[], uuid, text, text)",
}

// DetectSchema compares the live catalog with the 0.16.0 baseline and the
// 0.17.0 shape (by its markers: upgradeColumns, upgradeFunctions, and the
// 0.16.0 functions it drops), naming the differences. Catalog queries only: no locks on
// pgflow tables, so it works while they are locked.
func DetectSchema(ctx context.Context, q Querier) (SchemaInfo, error) {
	info := SchemaInfo{Differences: []string{}}
	var hasSchema bool
	if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_namespace where nspname = 'pgflow')`).Scan(&hasSchema); err != nil {
		return info, fmt.Errorf("detecting the pgflow schema: %w", err)
	}
	if !hasSchema {
		info.State = StateNotPgflow
		return info, nil
	}

	// Every ordinary/partitioned table of pgflow with its columns.
	cols := map[string]map[string]string{} // table → column → type
	rows, err := q.Query(ctx, `
		select c.relname::text, coalesce(a.attname::text, ''), coalesce(pg_catalog.format_type(a.atttypid, a.atttypmod), '')
		from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgflow'
		left join pg_catalog.pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
		where c.relkind in ('r', 'p')`)
	if err != nil {
		return info, fmt.Errorf("reading pgflow tables from pg_catalog: %w", err)
	}
	for rows.Next() {
		var table, col, typ string
		if err := rows.Scan(&table, &col, &typ); err != nil {
			rows.Close()
			return info, fmt.Errorf("reading pgflow tables from pg_catalog: %w", err)
		}
		if cols[table] == nil {
			cols[table] = map[string]string{}
		}
		if col != "" {
			cols[table][col] = typ
		}
	}
	if err := rows.Err(); err != nil {
		return info, fmt.Errorf("reading pgflow tables from pg_catalog: %w", err)
	}

	funcs := map[string]bool{}
	rows, err = q.Query(ctx, `
		select p.proname::text || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')'
		from pg_catalog.pg_proc p
		join pg_catalog.pg_namespace n on n.oid = p.pronamespace and n.nspname = 'pgflow'`)
	if err != nil {
		return info, fmt.Errorf("reading pgflow functions from pg_catalog: %w", err)
	}
	for rows.Next() {
		var sig string
		if err := rows.Scan(&sig); err != nil {
			rows.Close()
			return info, fmt.Errorf("reading pgflow functions from pg_catalog: %w", err)
		}
		funcs[sig] = true
	}
	if err := rows.Err(); err != nil {
		return info, fmt.Errorf("reading pgflow functions from pg_catalog: %w", err)
	}

	info.HasTables = true
	for _, t := range dataTables {
		if cols[t] == nil {
			info.HasTables = false
		}
	}

	var baseDiffs []string
	tables := make([]string, 0, len(baselineColumns))
	for t := range baselineColumns {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	found := 0
	for _, t := range tables {
		have := cols[t]
		if have == nil {
			baseDiffs = append(baseDiffs, "missing table pgflow."+t)
			continue
		}
		found++
		for _, c := range baselineColumns[t] {
			switch got, ok := have[c[0]]; {
			case !ok:
				baseDiffs = append(baseDiffs, fmt.Sprintf("missing column pgflow.%s.%s", t, c[0]))
			case got != c[1]:
				baseDiffs = append(baseDiffs, fmt.Sprintf("pgflow.%s.%s is %s, expected %s", t, c[0], got, c[1]))
			}
		}
	}
	if found == 0 {
		info.State = StateUnknown
		info.Differences = append(info.Differences, "schema pgflow has none of the pgflow tables")
		return info, nil
	}
	for _, f := range commonFunctions {
		if !funcs[f] {
			baseDiffs = append(baseDiffs, "missing function pgflow."+f)
		}
	}

	var legacyHave, legacyMissing, upHave, upMissing []string
	for _, f := range legacyFunctions {
		if funcs[f] {
			legacyHave = append(legacyHave, "pgflow."+f)
		} else {
			legacyMissing = append(legacyMissing, "pgflow."+f)
		}
	}
	mark := func(present bool, what string) {
		if present {
			upHave = append(upHave, what)
		} else {
			upMissing = append(upMissing, what)
		}
	}
	for _, c := range upgradeColumns {
		_, ok := cols[c[0]][c[1]]
		mark(ok, fmt.Sprintf("column pgflow.%s.%s", c[0], c[1]))
	}
	for _, t := range upgradeTables {
		mark(cols[t] != nil, "table pgflow."+t)
	}
	for _, f := range upgradeFunctions {
		mark(funcs[f], "function pgflow."+f)
	}

	switch {
	case len(baseDiffs) == 0 && len(legacyMissing) == 0 && len(upHave) == 0:
		info.State = StateBaseline
	case len(baseDiffs) == 0 && len(upMissing) == 0 && len(legacyHave) == 0:
		info.State = StateUpgraded
	default:
		info.State = StatePartial
		info.Differences = append(info.Differences, baseDiffs...)
		if len(upHave) > 0 || len(legacyMissing) > 0 {
			// Some of the upgrade is there: say what is and is not.
			for _, s := range upHave {
				info.Differences = append(info.Differences, "has "+s+" (upgrade)")
			}
			for _, s := range upMissing {
				info.Differences = append(info.Differences, "lacks "+s+" (upgrade)")
			}
			for _, s := range legacyHave {
				info.Differences = append(info.Differences, "still has "+s+" (0.16.0, dropped by the upgrade)")
			}
			for _, s := range legacyMissing {
				info.Differences = append(info.Differences, "lacks "+s+" (0.16.0)")
			}
		}
	}
	return info, nil
}

// describe is a one-line description of the state.
func (s SchemaInfo) describe() string {
	switch s.State {
	case StateBaseline:
		return "pgflow 0.16.0 baseline, not upgraded"
	case StateUpgraded:
		return "pgflow 0.17.0 (upgraded; apply is a no-op)"
	case StatePartial:
		return "partially upgraded or modified pgflow schema: " + strings.Join(s.Differences, "; ")
	case StateUnknown:
		return "schema pgflow exists but does not look like pgflow: " + strings.Join(s.Differences, "; ")
	}
	return "no pgflow schema in this database"
}
