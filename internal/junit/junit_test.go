package junit_test

import (
	"bytes"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/junit"
)

func TestJUnitIsValidXML(t *testing.T) {
	results := []scenario.Result{
		{Name: "ok-one", Proves: "it works", Passed: true, Duration: 1500 * time.Millisecond, Notes: []string{"a note"}},
		{Name: "bad-one", Proves: "it <breaks> & more", Passed: false, Error: "first line\nsecond line with ]]> and \x1b escape", Duration: time.Second},
	}
	var buf bytes.Buffer
	if err := junit.Write(&buf, "pgflow-upgrade replay", time.Now(), results); err != nil {
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

// A scenario that was not run is <skipped> with its reason: counted in the
// suite's skipped, never as a failure or a pass.
func TestJUnitSkipped(t *testing.T) {
	results := []scenario.Result{
		{Name: "ran", Proves: "it works", Passed: true, Duration: time.Second},
		{Name: "not-run", Proves: "needs a folder", Skipped: true, SkipReason: "needs --pgflow-migrations DIR"},
	}
	var buf bytes.Buffer
	if err := junit.Write(&buf, "replay", time.Now(), results); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Failures int `xml:"failures,attr"`
			Skipped  int `xml:"skipped,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil || len(doc.Suites) != 1 || len(doc.Suites[0].Cases) != 2 {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	s := doc.Suites[0]
	if s.Failures != 0 || s.Skipped != 1 || s.Cases[0].Skipped != nil || s.Cases[1].Failure != nil ||
		s.Cases[1].Skipped == nil || s.Cases[1].Skipped.Message != "needs --pgflow-migrations DIR" {
		t.Fatalf("skipped case not written as <skipped>:\n%s", buf.String())
	}
}
