package versions_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

func TestKnownVersions(t *testing.T) {
	want := []string{"0.14.x", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1+"}
	if got := versions.Names(); !slices.Equal(got, want) {
		t.Fatalf("versions %v, want %v", got, want)
	}
	last := map[string]string{
		"0.14.x": "20260214181656_pgflow_step_conditions.sql", "0.15.0": "20260607175525_pgflow_worker_start_mode.sql",
		"0.15.1": "20260904095427_pgflow_task_lifecycle_hardening.sql", "0.16.0": "20260907082520_pgflow_remove_legacy_flow_compilation.sql",
		"0.17.0": "20260915074120_pgflow_private_step_queues.sql", "0.17.1+": "20260920093533_pgflow_telemetry.sql",
	}
	counts := map[string]int{"0.14.x": 20, "0.15.0": 21, "0.15.1": 22, "0.16.0": 23, "0.17.0": 24, "0.17.1+": 26}
	for _, v := range versions.All() {
		if got := v.Last().File(); got != last[v.Name] || len(v.Migrations) != counts[v.Name] {
			t.Errorf("%s: %d migrations ending %s, want %d ending %s", v, len(v.Migrations), got, counts[v.Name], last[v.Name])
		}
		if v.Catalog.Schema != "pgflow" || len(v.Catalog.Tables) != 8 {
			t.Errorf("%s: schema %q, %d tables", v, v.Catalog.Schema, len(v.Catalog.Tables))
		}
		// The protocol a version's worker speaks is in its own catalog.
		for _, s := range []versions.Signature{v.Protocol.EnsureFlowCompiled, v.Protocol.StartTasks, v.Protocol.TrackWorkerFunction} {
			if s.In(v.Catalog) == nil {
				t.Errorf("%s: protocol function %s not in its catalog", v, s)
			}
		}
		st := v.Catalog.Table("step_tasks")
		if got := st.Column("queue_name") != nil; got != v.Protocol.QueueIdentity {
			t.Errorf("%s: step_tasks.queue_name %v, QueueIdentity %v", v, got, v.Protocol.QueueIdentity)
		}
		if got := v.Catalog.Table("workers").Column("pgflow_version") != nil; got != v.Protocol.WorkerReportsVersion {
			t.Errorf("%s: workers.pgflow_version %v, WorkerReportsVersion %v", v, got, v.Protocol.WorkerReportsVersion)
		}
	}
	// The fence: 0.17 has no 3-argument start_tasks; 0.16.0 has no 5-argument one.
	if versions.StartTasks016.In(versions.MustLookup("0.17.0").Catalog) != nil || versions.StartTasks017.In(versions.MustLookup("0.16.0").Catalog) != nil {
		t.Error("start_tasks signatures overlap between 0.16.0 and 0.17.0")
	}
	if got := versions.StartTasks016.String(); got != "pgflow.start_tasks(text, bigint[], uuid)" {
		t.Errorf("signature %q", got)
	}
	if versions.FlowModeRoute("My_Flow") != "my_flow" || versions.MaxQueueNameLength != 47 {
		t.Error("naming rule")
	}
}

// Every description differs from every other: detection can tell them apart.
func TestDescriptionsAreDistinct(t *testing.T) {
	all := versions.All()
	for i, a := range all {
		for _, b := range all[i+1:] {
			if len(catalog.Missing(a.Catalog, b.Catalog)) == 0 && len(catalog.Missing(b.Catalog, a.Catalog)) == 0 {
				t.Errorf("%s and %s cannot be told apart", a, b)
			}
		}
	}
}

// 0.15.0 is derived backward from 0.16.0 (undoing migrations 22-23); derived
// forward from 0.14.1 with migration 21's catalog changes it must be the same.
func TestDerived015AgreesWithForwardDerivation(t *testing.T) {
	v014 := versions.MustLookup("0.14.x").Catalog.Clone()
	v016 := versions.MustLookup("0.16.0").Catalog
	// Migration 21: worker_functions.start_mode and its check, and
	// track_worker_function(text) replaced by (text, text).
	wf, wf16 := v014.Table("worker_functions"), v016.Table("worker_functions")
	wf.Columns = append(wf.Columns, *wf16.Column("start_mode"))
	wf.Constraints = append(wf.Constraints, *wf16.Constraint("worker_functions_start_mode_check"))
	slices.SortFunc(wf.Constraints, func(a, b catalog.Constraint) int { return strings.Compare(a.Name, b.Name) })
	v014.Functions = slices.DeleteFunc(v014.Functions, func(f catalog.Function) bool {
		return f.Name == "track_worker_function"
	})
	v014.Functions = append(v014.Functions, *versions.TrackWorkerFunction015.In(v016))
	slices.SortFunc(v014.Functions, func(a, b catalog.Function) int {
		return strings.Compare(a.Name+"("+a.IdentityArguments, b.Name+"("+b.IdentityArguments)
	})
	if d := catalog.Diff(versions.MustLookup("0.15.0").Catalog, v014); len(d) != 0 {
		t.Errorf("0.15.0 backward vs forward:\n%s", strings.Join(catalog.Strings(d), "\n"))
	}
	// And 0.15.1 differs from 0.15.0 only in valid_status.
	d := catalog.Diff(versions.MustLookup("0.15.0").Catalog, versions.MustLookup("0.15.1").Catalog)
	if len(d) != 1 || d[0].Kind != catalog.KindConstraint || d[0].Name != "valid_status" || !strings.Contains(d[0].Got, "'cancelled'") {
		t.Errorf("0.15.0 → 0.15.1: %v", catalog.Strings(d))
	}
}
