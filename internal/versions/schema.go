package versions

import (
	"context"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// SchemaState is the coarse state the checks, apply, status and capture
// act on, derived from the detected version (SchemaInfo.Version).
type SchemaState string

const (
	SchemaBaseline  SchemaState = "baseline"   // pgflow 0.16.0, not upgraded: what apply starts from
	SchemaUpgraded  SchemaState = "upgraded"   // pgflow 0.17.x (by this tool or pgflow's own migration)
	SchemaOlder     SchemaState = "older"      // pgflow before 0.16.0: upstream's files (the user's copy) take it to 0.16.0 first
	SchemaPartial   SchemaState = "partial"    // pgflow tables, but no known version exactly
	SchemaUnknown   SchemaState = "unknown"    // a pgflow schema without the pgflow tables
	SchemaNotPgflow SchemaState = "not_pgflow" // no schema pgflow
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
	Version *Detection `json:"-"`
}

// dataTables are the tables the data checks read.
var dataTables = []string{"flows", "steps", "runs", "step_states", "step_tasks", "workers"}

// DetectSchema says which pgflow the database has (Detect: one catalog
// query, no locks on pgflow tables, so it works while they are locked) and
// maps it to the coarse state, so `audit`, `status`, `apply` and the online
// path always agree on what a database is.
func DetectSchema(ctx context.Context, q catalog.Querier) (SchemaInfo, error) {
	d, err := Detect(ctx, q)
	if err != nil {
		return SchemaInfo{Differences: []string{}}, err
	}
	return d.SchemaInfo(), nil
}

// SchemaInfo maps the detection to the coarse state.
func (d *Detection) SchemaInfo() SchemaInfo {
	info := SchemaInfo{Version: d, Differences: d.DifferenceStrings()}
	if d.Catalog != nil {
		info.HasTables = true
		for _, t := range dataTables {
			info.HasTables = info.HasTables && d.Catalog.Table(t) != nil
		}
	}
	switch d.State {
	case StateNotPgflow:
		info.State = SchemaNotPgflow
	case StateReady:
		info.State = SchemaBaseline
	case StateUpgraded:
		info.State = SchemaUpgraded
	case StateOlder:
		info.State = SchemaOlder
	default:
		info.State = SchemaPartial
		if !info.HasTables && d.Closest == "" {
			info.State = SchemaUnknown
		}
	}
	return info
}

// Describe is a one-line description of the state: the version found, what
// differs, and the next step.
func (s SchemaInfo) Describe() string {
	if s.Version == nil {
		return string(s.State)
	}
	out := s.Version.Summary()
	if len(s.Differences) > 0 {
		out += ": " + strings.Join(s.Differences, "; ")
	}
	return out + ". Next: " + s.Version.NextStep
}
