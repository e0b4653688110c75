// Package junit writes scenario results as JUnit XML, the subset CI
// systems read: one <testsuite> with one <testcase> per scenario; a failed
// scenario has a <failure> whose message is the first line of its error and
// whose body is the whole error; a scenario that was not run has a
// <skipped> saying why; a scenario's measured figures (and their
// budgets) are its <properties>. `pgflow-upgrade fixtures replay --junit`
// writes it.
package junit

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
)

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Errors    int         `xml:"errors,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr"`
	Cases     []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name       string           `xml:"name,attr"`
	Classname  string           `xml:"classname,attr"`
	Time       string           `xml:"time,attr"`
	Properties *junitProperties `xml:"properties,omitempty"`
	Failure    *junitFailure    `xml:"failure,omitempty"`
	Skipped    *junitSkipped    `xml:"skipped,omitempty"`
	SystemOut  string           `xml:"system-out,omitempty"`
}

// junitProperties carry a case's measured figures (<property name value>).
type junitProperties struct {
	Property []junitProperty `xml:"property"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

// junitSkipped marks a scenario that was not run, with why.
type junitSkipped struct {
	Message string `xml:"message,attr"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Body    string `xml:",chardata"`
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// Write writes results as JUnit XML: one suite named suite, started then.
func Write(w io.Writer, suite string, started time.Time, results []scenario.Result) error {
	var total time.Duration
	s := junitSuite{Name: suite, Tests: len(results), Timestamp: started.UTC().Format("2006-01-02T15:04:05")}
	for _, r := range results {
		total += r.Duration
		c := junitCase{Name: r.Name, Classname: suite, Time: secs(r.Duration)}
		out := r.Proves
		if len(r.Notes) > 0 {
			out += "\n" + strings.Join(r.Notes, "\n")
		}
		c.SystemOut = out
		if len(r.Metrics) > 0 {
			c.Properties = &junitProperties{}
			for _, m := range r.Metrics {
				c.Properties.Property = append(c.Properties.Property, junitProperty{m.Name + "_ms", fmt.Sprintf("%g", m.MS)})
				if m.BudgetMS > 0 {
					c.Properties.Property = append(c.Properties.Property, junitProperty{m.Name + "_budget_ms", fmt.Sprintf("%g", m.BudgetMS)})
				}
			}
		}
		switch {
		case r.Skipped:
			s.Skipped++
			c.Skipped = &junitSkipped{Message: r.SkipReason}
		case !r.Passed:
			s.Failures++
			c.Failure = &junitFailure{Message: firstLine(r.Error), Type: "ScenarioFailed", Body: r.Error}
		}
		s.Cases = append(s.Cases, c)
	}
	s.Time = secs(total)
	doc := junitSuites{Name: suite, Tests: s.Tests, Failures: s.Failures, Time: s.Time, Suites: []junitSuite{s}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("writing JUnit XML: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
