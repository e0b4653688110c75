package versions

// TEMPORARY — delete this file when migrations/ is retargeted to upstream's
// 0.17.0 (issue 13's "the upgrade's own tests may keep today's model as
// their starting point"; the retargeting issue removes the model).
//
// The project's old model of 0.16.0 (fixtures' model SQL, with helpers
// upstream never had: _cascade, _fail_run, _skip_step, ...) and the state
// today's migration leaves it in are not pgflow versions, but until the
// migration is retargeted the upgrade's own tests start from the model and
// end in its upgraded shape. classifyModel is the one place that still
// recognises them, by the objects the migration adds and drops; it runs
// only when no real version matched.

import (
	"slices"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// Names the model's states are reported under.
const (
	ModelBaseline = "model-0.16.0"   // the old model: apply accepts it (StateReady)
	ModelUpgraded = "model-upgraded" // the old migration's result (StateUpgraded)
)

// modelMarker: a helper only the model has.
var modelMarker = Signature{"_cascade", "p_run_id uuid"}

// modelColumns: the columns (and types) the old migration and the checks
// rely on, per table.
var modelColumns = map[string][][2]string{
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

// What the old migration adds (its "new protocol") and drops (the fence),
// by name and argument types.
var (
	modelAddedColumns   = [][2]string{{"flows", "queue_name"}, {"step_tasks", "queue_name"}}
	modelAddedTables    = []string{"schema_revisions"}
	modelAddedFunctions = [][2]string{{"queue_protocol_version", ""}, {"ensure_flow_compiled", "text, jsonb, boolean"},
		{"claim_tasks", "text, uuid, integer, integer, integer, integer"}}
	modelDroppedFunctions = [][2]string{{"ensure_flow_compiled", "text, jsonb"}, {"start_tasks", "text, bigint[], uuid"}}
)

// classifyModel fills d when c is the model, its upgraded shape, or
// something between (StateUnknown, closest the model, the differences
// typed); false when c is not the model at all.
func classifyModel(c *catalog.Catalog, d *Detection) bool {
	if modelMarker.In(c) == nil {
		return false
	}
	upgraded := c.Table("schema_revisions") != nil
	var diffs []catalog.Difference
	for _, t := range sortedKeys(modelColumns) {
		tbl := c.Table(t)
		if tbl == nil {
			diffs = append(diffs, catalog.Difference{Kind: catalog.KindTable, Name: t, Object: Schema + "." + t, Change: catalog.ChangeMissing})
			continue
		}
		for _, col := range modelColumns[t] {
			obj := Schema + "." + t + "." + col[0]
			switch got := tbl.Column(col[0]); {
			case got == nil:
				diffs = append(diffs, catalog.Difference{Kind: catalog.KindColumn, Table: t, Name: col[0], Object: obj, Change: catalog.ChangeMissing})
			case got.Type != col[1]:
				diffs = append(diffs, catalog.Difference{Kind: catalog.KindColumn, Table: t, Name: col[0], Object: obj, Change: catalog.ChangeChanged, Field: "type", Want: col[1], Got: got.Type})
			}
		}
	}
	// present(want) names an object that should (want) or should not be there.
	present := func(kind catalog.Kind, table, name, obj string, have, want bool) {
		switch {
		case have && !want:
			diffs = append(diffs, catalog.Difference{Kind: kind, Table: table, Name: name, Object: obj, Change: catalog.ChangeExtra})
		case !have && want:
			diffs = append(diffs, catalog.Difference{Kind: kind, Table: table, Name: name, Object: obj, Change: catalog.ChangeMissing})
		}
	}
	for _, tc := range modelAddedColumns {
		have := c.Table(tc[0]) != nil && c.Table(tc[0]).Column(tc[1]) != nil
		present(catalog.KindColumn, tc[0], tc[1], Schema+"."+tc[0]+"."+tc[1], have, upgraded)
	}
	for _, t := range modelAddedTables {
		present(catalog.KindTable, "", t, Schema+"."+t, c.Table(t) != nil, upgraded)
	}
	for _, f := range modelAddedFunctions {
		present(catalog.KindFunction, "", f[0], Schema+"."+f[0]+"("+f[1]+")", hasTypes(c, f[0], f[1]), upgraded)
	}
	for _, f := range modelDroppedFunctions {
		present(catalog.KindFunction, "", f[0], Schema+"."+f[0]+"("+f[1]+")", hasTypes(c, f[0], f[1]), !upgraded)
	}
	switch {
	case len(diffs) > 0:
		d.State, d.Closest, d.Differences = StateUnknown, ModelBaseline, diffs
		if upgraded {
			d.Closest = ModelUpgraded
		}
	case upgraded:
		d.Found, d.State, d.Exact = ModelUpgraded, StateUpgraded, true
	default:
		d.Found, d.State, d.Exact = ModelBaseline, StateReady, true
	}
	return true
}

// IsModel: the detection is about the old model (found or closest); the
// callers that still need to know (the old migration's guards) ask this.
func (d *Detection) IsModel() bool {
	return d.Found == ModelBaseline || d.Found == ModelUpgraded || d.Closest == ModelBaseline || d.Closest == ModelUpgraded
}

func hasTypes(c *catalog.Catalog, name, types string) bool {
	return slices.ContainsFunc(c.Functions, func(f catalog.Function) bool {
		return f.Name == name && catalog.TypesOnly(f.IdentityArguments) == types
	})
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
