package catalog_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

func sample() *catalog.Catalog {
	v := "1.5.1"
	return &catalog.Catalog{
		Format: catalog.Format, Schema: "pgflow", PGMQ: catalog.PGMQ{ExtensionVersion: &v},
		Tables: []catalog.Table{{
			Kind: "table", Name: "step_tasks",
			Columns:     []catalog.Column{{Name: "flow_slug", Type: "text", NotNull: true}, {Name: "message_id", Type: "bigint"}},
			Indexes:     []catalog.Index{{Name: "idx_step_tasks_queued_msg", Definition: "CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (message_id)"}},
			Constraints: []catalog.Constraint{{Name: "valid_status", Contype: "c", Definition: "CHECK (true)"}},
		}},
		Functions: []catalog.Function{{Kind: "function", Name: "start_tasks", IdentityArguments: "flow_slug text, msg_ids bigint[], worker_id uuid",
			Arguments: "flow_slug text, msg_ids bigint[], worker_id uuid", Result: "SETOF pgflow.step_task_record", Language: "plpgsql",
			Volatility: "volatile", Parallel: "unsafe", Config: []string{`search_path=""`}}},
	}
}

func TestDiffEqual(t *testing.T) {
	if d := catalog.Diff(sample(), sample()); len(d) != 0 {
		t.Fatalf("equal catalogs differ: %v", d)
	}
}

// What users add: Missing ignores it, Diff names it.
func TestMissingToleratesAdditions(t *testing.T) {
	got := sample()
	st := &got.Tables[0]
	st.Indexes = append(st.Indexes, catalog.Index{Name: "my_idx", Definition: "CREATE INDEX my_idx ON pgflow.step_tasks USING btree (flow_slug)"})
	st.Constraints = append(st.Constraints, catalog.Constraint{Name: "my_check", Contype: "c", Definition: "CHECK (false)"})
	got.Functions = append(got.Functions, catalog.Function{Name: "my_fn", Kind: "function"})
	got.Triggers = append(got.Triggers, catalog.Trigger{Name: "audit_trg", Table: "step_tasks", Definition: "CREATE TRIGGER ..."})
	got.Tables = append(got.Tables, catalog.Table{Kind: "table", Name: "my_table"})
	got.PGMQ.ExtensionVersion = nil
	if m := catalog.Missing(sample(), got); len(m) != 0 {
		t.Errorf("Missing names user additions: %v", catalog.Strings(m))
	}
	want := []string{
		"constraint my_check on pgflow.step_tasks: extra (not in the description)",
		"index my_idx on pgflow.step_tasks: extra (not in the description)",
		"table pgflow.my_table: extra (not in the description)",
		"function pgflow.my_fn(): extra (not in the description)",
		"trigger audit_trg on pgflow.step_tasks: extra (not in the description)",
		"pgmq extension: extension_version differs: want 1.5.1, got (none)",
	}
	if got := catalog.Strings(catalog.Diff(sample(), got)); !reflect.DeepEqual(got, want) {
		t.Errorf("Diff\n got %q\nwant %q", got, want)
	}
}

func TestMissingNamesWhatARequiredObjectLacks(t *testing.T) {
	got := sample()
	got.Functions = nil
	st := &got.Tables[0]
	st.Indexes[0].Definition = "CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (flow_slug)"
	st.Columns = []catalog.Column{{Name: "message_id", Type: "integer"}, {Name: "flow_slug", Type: "text", NotNull: true}, {Name: "queue_name", Type: "text"}}
	st.Constraints = nil
	m := catalog.Missing(sample(), got)
	want := []string{
		"column pgflow.step_tasks.message_id: type differs: want bigint, got integer",
		"column pgflow.step_tasks.queue_name: extra (not in the description)",
		"table pgflow.step_tasks: column order differs: want flow_slug, message_id, got message_id, flow_slug",
		"constraint valid_status on pgflow.step_tasks: missing",
		"index idx_step_tasks_queued_msg on pgflow.step_tasks: definition differs: want CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (message_id), got CREATE INDEX idx_step_tasks_queued_msg ON pgflow.step_tasks USING btree (flow_slug)",
		"function pgflow.start_tasks(text, bigint[], uuid): missing",
	}
	if got := catalog.Strings(m); !reflect.DeepEqual(got, want) {
		t.Errorf("Missing\n got %q\nwant %q", got, want)
	}
	// Typed: a caller can tell what without reading the message.
	i := slices.IndexFunc(m, func(d catalog.Difference) bool {
		return d.Kind == catalog.KindColumn && d.Change == catalog.ChangeExtra
	})
	if i < 0 || m[i].Table != "step_tasks" || m[i].Name != "queue_name" {
		t.Errorf("extra column not typed: %+v", m)
	}
	i = slices.IndexFunc(m, func(d catalog.Difference) bool { return d.Kind == catalog.KindFunction })
	if i < 0 || m[i].Change != catalog.ChangeMissing || m[i].Name != "start_tasks(flow_slug text, msg_ids bigint[], worker_id uuid)" {
		t.Errorf("missing function not typed: %+v", m)
	}
}

func TestFunctionAttributesCompared(t *testing.T) {
	got := sample()
	f := &got.Functions[0]
	f.Language, f.Config, f.SecurityDefiner = "sql", nil, true
	want := []string{
		"function pgflow.start_tasks(text, bigint[], uuid): language differs: want plpgsql, got sql",
		"function pgflow.start_tasks(text, bigint[], uuid): security_definer differs: want false, got true",
		`function pgflow.start_tasks(text, bigint[], uuid): config differs: want search_path="", got (none)`,
	}
	if got := catalog.Strings(catalog.Missing(sample(), got)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestTypesOnly(t *testing.T) {
	for in, want := range map[string]string{
		"": "",
		"flow_slug text, msg_ids bigint[], worker_id uuid": "text, bigint[], uuid",
		"text, integer":                        "text, integer",
		"at timestamp with time zone":          "timestamp with time zone",
		"timestamp with time zone":             "timestamp with time zone",
		"character varying(10)":                "character varying(10)",
		`"Odd Name" text, VARIADIC xs jsonb[]`: "text, jsonb[]",
		"p double precision":                   "double precision",
	} {
		if got := catalog.TypesOnly(in); got != want {
			t.Errorf("TypesOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for name, in := range map[string]string{
		"unknown key": `{"format": "pgflow-catalog/1", "schema": "pgflow", "surprise": 1}`,
		"format":      `{"format": "pgflow-catalog/2", "schema": "pgflow"}`,
		"not json":    `{`,
	} {
		if _, err := catalog.Parse([]byte(in)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
