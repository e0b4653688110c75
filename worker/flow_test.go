package worker

import (
	"encoding/json"
	"testing"
)

func TestShapeWritesDefaultsAndPatterns(t *testing.T) {
	f := Flow{
		Slug:    "orders",
		Options: FlowOptions{MaxAttempts: Int(5), BaseDelay: Int(0)},
		Steps: []Step{
			{Slug: "load"},
			{Slug: "items", Type: StepMap, DependsOn: []string{"load"}, Options: StepOptions{Timeout: Int(30)}},
			{Slug: "total", DependsOn: []string{"items", "load"}, WhenUnmet: PolicyFail,
				RequiredInputPattern: json.RawMessage(`{ "load": {"ok": true} }`)},
		},
	}
	got, err := f.Shape()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"steps":[` +
		`{"slug":"load","stepType":"single","dependencies":[],"whenUnmet":"skip","whenExhausted":"fail","requiredInputPattern":{"defined":false},"forbiddenInputPattern":{"defined":false}},` +
		`{"slug":"items","stepType":"map","dependencies":["load"],"whenUnmet":"skip","whenExhausted":"fail","requiredInputPattern":{"defined":false},"forbiddenInputPattern":{"defined":false},"options":{"timeout":30}},` +
		`{"slug":"total","stepType":"single","dependencies":["items","load"],"whenUnmet":"fail","whenExhausted":"fail","requiredInputPattern":{"defined":true,"value":{"load":{"ok":true}}},"forbiddenInputPattern":{"defined":false}}` +
		`],"options":{"maxAttempts":5,"baseDelay":0}}`
	if string(got) != want {
		t.Errorf("shape\n got %s\nwant %s", got, want)
	}
}

func TestShapeRejectsInvalidFlow(t *testing.T) {
	if _, err := (Flow{Slug: "x", Steps: []Step{{Slug: "a", DependsOn: []string{"a"}}}}).Shape(); err == nil {
		t.Error("a step depending on itself was accepted")
	}
}
