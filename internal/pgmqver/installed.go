package pgmqver

import (
	"context"
	"fmt"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Found says which pgmq a database has (Detect reads it).
type Found struct {
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

func (p Found) String() string {
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

// Detect reads pg_extension, pg_namespace and pg_proc (catalog rows
// only: no USAGE on schema pgmq needed). Installed needs pgmq.list_queues()
// too, since the queue checks call it.
func Detect(ctx context.Context, q session.Querier) (Found, error) {
	var info Found
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
		if v, err := Parse(info.Version); err == nil {
			info.Layout = "detached"
			if MembersLayout(v) {
				info.Layout = "members"
			}
		}
	case schema:
		info.Kind = "schema"
	}
	info.Installed = info.Kind != "" && listQueues
	return info, nil
}
