package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// SchemaState is the coarse state the checks act on, derived from the
// pgflow version internal/versions detects (SchemaInfo.Version).
type SchemaState string

const (
	StateBaseline  SchemaState = "baseline"   // pgflow 0.16.0, not upgraded: what apply starts from
	StateUpgraded  SchemaState = "upgraded"   // pgflow 0.17.x (by this tool or pgflow's own migration)
	StateOlder     SchemaState = "older"      // pgflow before 0.16.0: pgflow's own installer first
	StatePartial   SchemaState = "partial"    // pgflow tables, but no known version exactly
	StateUnknown   SchemaState = "unknown"    // a pgflow schema without the pgflow tables
	StateNotPgflow SchemaState = "not_pgflow" // no schema pgflow
)

// SchemaInfo is what DetectSchema found.
type SchemaInfo struct {
	State SchemaState `json:"state"`
	// HasTables: the tables the data checks read exist (flows, steps, runs,
	// step_states, step_tasks, workers).
	HasTables bool `json:"has_tables"`
	// Differences from the closest known version (empty when one matched).
	Differences []string `json:"differences"`
	// Version is the detection itself: which pgflow, and the next step.
	// Reports carry it as their top-level "pgflow_version".
	Version *versions.Detection `json:"-"`
}

// PGMQInfo says which pgmq a database has.
type PGMQInfo struct {
	Installed bool `json:"installed"`
	// Kind: "extension" (CREATE EXTENSION pgmq) or "schema" (a pgmq schema
	// that is not an extension, e.g. installed from SQL), "" when absent.
	Kind    string `json:"kind"`
	Version string `json:"version"` // extversion, "" for a schema install
	// Layout: whether the queue tables are extension members, as the
	// version makes them ("members" below 1.6.0, "detached" from 1.6.0;
	// "" for a schema install or an unreadable version).
	Layout string `json:"layout,omitempty"`
	// Newest: the newest pgmq version the server could update to
	// (pg_available_extension_versions; "" when it offers none).
	Newest string `json:"newest_available,omitempty"`
}

func (p PGMQInfo) String() string {
	switch {
	case !p.Installed:
		return "not installed"
	case p.Kind == "extension" && p.Layout != "":
		return "extension " + p.Version + " (queue tables " + map[string]string{"members": "extension members", "detached": "not extension members"}[p.Layout] + ")"
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
		       coalesce((select v.version from pg_catalog.pg_available_extension_versions v
		                 where v.name = 'pgmq' and v.version ~ '^[0-9]+(\.[0-9]+){1,2}$'
		                 order by pg_catalog.string_to_array(v.version, '.')::int[] desc limit 1), ''),
		       exists (select 1 from pg_catalog.pg_namespace where nspname = 'pgmq'),
		       exists (select 1 from pg_catalog.pg_proc p
		               join pg_catalog.pg_namespace n on n.oid = p.pronamespace and n.nspname = 'pgmq'
		               where p.proname = 'list_queues' and p.pronargs = 0)`).Scan(&ext, &version, &info.Newest, &schema, &listQueues)
	if err != nil {
		return info, fmt.Errorf("detecting pgmq: %w", err)
	}
	switch {
	case ext:
		info.Kind = "extension"
		if version != nil {
			info.Version = *version
		}
		if v, err := pgmqver.Parse(info.Version); err == nil {
			info.Layout = "detached"
			if pgmqver.MembersLayout(v) {
				info.Layout = "members"
			}
		}
	case schema:
		info.Kind = "schema"
	}
	info.Installed = info.Kind != "" && listQueues
	return info, nil
}

// dataTables are the tables the data checks read.
var dataTables = []string{"flows", "steps", "runs", "step_states", "step_tasks", "workers"}

// DetectSchema says which pgflow the database has (internal/versions: one
// catalog query, no locks on pgflow tables, so it works while they are
// locked) and maps it to the state the checks act on.
func DetectSchema(ctx context.Context, q Querier) (SchemaInfo, error) {
	d, err := versions.Detect(ctx, q)
	if err != nil {
		return SchemaInfo{Differences: []string{}}, err
	}
	return schemaInfo(d), nil
}

func schemaInfo(d *versions.Detection) SchemaInfo {
	info := SchemaInfo{Version: d, Differences: d.DifferenceStrings()}
	if d.Catalog != nil {
		info.HasTables = true
		for _, t := range dataTables {
			info.HasTables = info.HasTables && d.Catalog.Table(t) != nil
		}
	}
	switch d.State {
	case versions.StateNotPgflow:
		info.State = StateNotPgflow
	case versions.StateReady:
		info.State = StateBaseline
	case versions.StateUpgraded:
		info.State = StateUpgraded
	case versions.StateOlder:
		info.State = StateOlder
	default:
		info.State = StatePartial
		if !info.HasTables && d.Closest == "" {
			info.State = StateUnknown
		}
	}
	return info
}

// describe is a one-line description of the state.
func (s SchemaInfo) describe() string {
	if s.Version == nil {
		return string(s.State)
	}
	out := s.Version.Summary()
	if len(s.Differences) > 0 {
		out += ": " + strings.Join(s.Differences, "; ")
	}
	return out + ". Next: " + s.Version.NextStep
}
