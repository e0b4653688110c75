// Package versions is the one typed description of every pgflow version
// this tool knows: its catalog (tables, constraints, indexes, types and
// functions with their attributes), the Supabase migrations it consists of,
// and the protocol details the other packages need (the worker's calls, the
// queue-name rule). Detection, audit, preflight, apply, verify, status, the
// online path and the worker read it here instead of keeping their own
// copies of pgflow's shape.
//
// Detect answers "which pgflow is this, and what is in progress" for every
// command: the version from the catalog, an unfinished `apply --online`
// (subpackage onlineshape) and an open `apply --quiesce` record (subpackage
// quiescerecord). Both subpackages import only internal/session: this
// package imports no feature package, so internal/online, internal/quiesce,
// internal/upgrade, audit and the public worker all depend on it, never the
// other way round.
//
// The catalogs of 0.14.1, 0.16.0, 0.17.0 and 0.17.1 are JSON files read from
// databases of those releases, embedded byte for byte (catalogs/); 0.15.0 and 0.15.1 are derived in code
// from the 0.16.0 catalog with the changes of migrations 21-23 (derive.go).
package versions

import (
	"embed"
	"fmt"
	"strings"
	"sync"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// Catalogs holds the embedded catalogs of the released versions.
//
//go:embed catalogs/*.catalog.json
var Catalogs embed.FS

// Schema is pgflow's schema; ToolSchema is this tool's own bookkeeping
// schema (never inside pgflow).
const (
	Schema     = "pgflow"
	ToolSchema = "pgflow_upgrade"
)

// State is what a version means to this tool.
type State string

const (
	StateNotPgflow State = "not_pgflow"         // no schema pgflow
	StateOlder     State = "older"              // before 0.16.0: upstream's files (the user's copy) first
	StateReady     State = "ready"              // 0.16.0: audit, then apply
	StateUpgraded  State = "upgraded"           // 0.17.x: nothing to do
	StateOnline    State = "online_in_progress" // an unfinished apply --online of ours
	StateUnknown   State = "unknown"            // none of the above: what differs is listed
)

// Version is one pgflow release (or series) as this tool knows it.
type Version struct {
	// Name as reported: "0.14.x", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1+".
	Name string
	// Series groups patch releases ("0.15.x").
	Series string
	// State: what the tool does with a database at this version.
	State State
	// Catalog is the schema pgflow of this version. Shared: read only.
	Catalog *catalog.Catalog
	// Migrations: upstream's Supabase migrations this version consists of,
	// in order (the ledger supabase_migrations.schema_migrations holds one
	// row per file, version = the 14-digit prefix).
	Migrations []Migration
	// Protocol: the worker-facing calls and rules of this version.
	Protocol Protocol
	// Source says where the description comes from.
	Source string
}

// String is the version's name.
func (v *Version) String() string { return v.Name }

// Last is the version's newest migration.
func (v *Version) Last() Migration { return v.Migrations[len(v.Migrations)-1] }

// Names of the known versions.
const (
	V0_14   = "0.14.x"
	V0_15_0 = "0.15.0"
	V0_15_1 = "0.15.1"
	V0_16_0 = "0.16.0"
	V0_17_0 = "0.17.0"
	V0_17_1 = "0.17.1+"
)

var (
	loadOnce sync.Once
	known    []*Version
	loadErr  error
)

// All is every known version, oldest first. It panics if an embedded
// catalog does not parse (a build defect, caught by the package's tests).
func All() []*Version {
	loadOnce.Do(func() { known, loadErr = load() })
	if loadErr != nil {
		panic(loadErr)
	}
	return known
}

// Lookup returns the version called name.
func Lookup(name string) (*Version, error) {
	for _, v := range All() {
		if v.Name == name {
			return v, nil
		}
	}
	return nil, fmt.Errorf("pgflow version %q: not one this tool knows (%s)", name, strings.Join(Names(), ", "))
}

// MustLookup is Lookup for the names above.
func MustLookup(name string) *Version {
	v, err := Lookup(name)
	if err != nil {
		panic(err)
	}
	return v
}

// Names lists the known versions, oldest first.
func Names() []string {
	var out []string
	for _, v := range All() {
		out = append(out, v.Name)
	}
	return out
}

// Facts reads one embedded release catalog (catalogs/), e.g. "0.16.0".
func Facts(release string) (*catalog.Catalog, error) {
	b, err := Catalogs.ReadFile("catalogs/pgflow-" + release + ".catalog.json")
	if err != nil {
		return nil, fmt.Errorf("reading the embedded catalog of pgflow %s: %w", release, err)
	}
	return catalog.Parse(b)
}

// TelemetrySchema is the schema upstream's 0.17.1 (file 26) creates.
const TelemetrySchema = "pgflow_telemetry"

// TelemetryCatalog is schema pgflow_telemetry as upstream's files build it
// (file 26; file 27 changes report()'s body only, which a catalog does not
// hold): catalogs/pgflow_telemetry-0.17.1.catalog.json, read from a
// database built from upstream's files and checked against one in tests.
func TelemetryCatalog() (*catalog.Catalog, error) {
	b, err := Catalogs.ReadFile("catalogs/" + TelemetrySchema + "-0.17.1.catalog.json")
	if err != nil {
		return nil, fmt.Errorf("reading the embedded catalog of %s: %w", TelemetrySchema, err)
	}
	return catalog.Parse(b)
}

func load() ([]*Version, error) {
	facts := map[string]*catalog.Catalog{}
	for _, r := range []string{"0.14.1", "0.16.0", "0.17.0", "0.17.1"} {
		c, err := Facts(r)
		if err != nil {
			return nil, err
		}
		facts[r] = c
	}
	v150, v151, err := derive015(facts["0.16.0"], facts["0.14.1"])
	if err != nil {
		return nil, err
	}
	return []*Version{
		{Name: V0_14, Series: "0.14.x", State: StateOlder, Catalog: facts["0.14.1"], Migrations: migrationsUpTo(20),
			Protocol: protocol014, Source: "facts catalog pgflow-0.14.1.catalog.json"},
		{Name: V0_15_0, Series: "0.15.x", State: StateOlder, Catalog: v150, Migrations: migrationsUpTo(21),
			Protocol: protocol015, Source: "derived from 0.16.0 (derive.go): migrations 22-23 undone"},
		{Name: V0_15_1, Series: "0.15.x", State: StateOlder, Catalog: v151, Migrations: migrationsUpTo(22),
			Protocol: protocol015, Source: "derived from 0.16.0 (derive.go): migration 23 undone"},
		{Name: V0_16_0, Series: "0.16.x", State: StateReady, Catalog: facts["0.16.0"], Migrations: migrationsUpTo(23),
			Protocol: protocol016, Source: "facts catalog pgflow-0.16.0.catalog.json"},
		{Name: V0_17_0, Series: "0.17.x", State: StateUpgraded, Catalog: facts["0.17.0"], Migrations: migrationsUpTo(24),
			Protocol: protocol0170, Source: "facts catalog pgflow-0.17.0.catalog.json"},
		{Name: V0_17_1, Series: "0.17.x", State: StateUpgraded, Catalog: facts["0.17.1"], Migrations: migrationsUpTo(26),
			Protocol: protocol0171, Source: "facts catalog pgflow-0.17.1.catalog.json; later 0.17.x patches that only add objects are tolerated"},
	}, nil
}
