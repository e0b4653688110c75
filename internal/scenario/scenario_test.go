package scenario_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/rehearsal"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

func TestJUnitIsValidXML(t *testing.T) {
	results := []scenario.Result{
		{Name: "ok-one", Proves: "it works", Passed: true, Duration: 1500 * time.Millisecond, Notes: []string{"a note"}},
		{Name: "bad-one", Proves: "it <breaks> & more", Passed: false, Error: "first line\nsecond line with ]]> and \x1b escape", Duration: time.Second},
	}
	var buf bytes.Buffer
	if err := scenario.WriteJUnit(&buf, "pgflow-upgrade replay", time.Now(), results); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName  xml.Name `xml:"testsuites"`
		Tests    int      `xml:"tests,attr"`
		Failures int      `xml:"failures,attr"`
		Suites   []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Cases    []struct {
				Name      string `xml:"name,attr"`
				Classname string `xml:"classname,attr"`
				Time      string `xml:"time,attr"`
				Failure   *struct {
					Message string `xml:"message,attr"`
					Body    string `xml:",chardata"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.Strict = true
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("not valid XML: %v\n%s", err, buf.String())
	}
	if doc.Tests != 2 || doc.Failures != 1 || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != 2 {
		t.Fatalf("wrong structure: %+v", doc)
	}
	cs := doc.Suites[0].Cases
	if cs[0].Name != "ok-one" || cs[0].Failure != nil || cs[0].Time != "1.500" || cs[0].Classname == "" {
		t.Errorf("passing case: %+v", cs[0])
	}
	if cs[1].Failure == nil || cs[1].Failure.Message != "first line" || !strings.Contains(cs[1].Failure.Body, "second line") {
		t.Errorf("failing case: %+v", cs[1])
	}
}

func TestSelect(t *testing.T) {
	all := scenario.Builtin()
	got, err := scenario.Select(all, []string{"state-survival", "clean-upgrade"})
	if err != nil || len(got) != 2 || got[0].Name != "state-survival" {
		t.Fatalf("Select: %v %v", got, err)
	}
	if _, err := scenario.Select(all, []string{"nope"}); err == nil || !strings.Contains(err.Error(), "clean-upgrade") {
		t.Fatalf("unknown name: %v", err)
	}
	seen := map[string]bool{}
	for _, s := range append(all, rehearsal.CaptureScenarios()...) {
		if s.Name == "" || s.Proves == "" || s.Run == nil || seen[s.Name] {
			t.Errorf("scenario %q: incomplete or duplicate", s.Name)
		}
		seen[s.Name] = true
	}
}

// The generator must reach every kind of state over a few seeds.
func TestGenerateCoversEveryKind(t *testing.T) {
	testdb.SkipIfShort(t, "The generator must reach every kind of state over a few seeds")
	ctx := context.Background()
	total := scenario.Census{}
	for seed := uint64(1); seed <= 8; seed++ {
		db := testdb.Baseline(t)
		if _, err := scenario.Generate(ctx, db.Pool, seed); err != nil {
			t.Fatal(err)
		}
		c, err := scenario.TakeCensus(ctx, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range c {
			total[k] += v
		}
	}
	for _, k := range []string{"run started", "run completed", "run failed", "task queued", "task started", "task retried",
		"task completed", "task failed", "map step with >= 3 tasks", "message visible", "message invisible", "message archived"} {
		if total[k] == 0 {
			t.Errorf("8 seeds never generated %q (got %s)", k, total)
		}
	}
}
