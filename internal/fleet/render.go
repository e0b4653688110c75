package fleet

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"
)

// Header is the columns of a group's rows.
func (r *Report) Header() []string {
	h := []string{"target", "release", "verdict", "blockers", "warnings", "lock window", "exit"}
	if r.Command == "status" || r.Command == "verify" {
		h = []string{"target", "release", "verdict", "exit"}
	}
	return append(h, "note")
}

// Row is e under Header.
func (r *Report) Row(e *Entry) []string {
	note := e.Note
	if e.Cause != "" && e.ExitCode != 0 {
		note = strings.TrimSpace(note + " " + e.Cause)
	}
	release := e.Release
	if release == "" {
		release = e.SchemaState
	}
	if r.Command == "status" || r.Command == "verify" {
		return []string{e.Name, release, e.Verdict, fmt.Sprint(e.ExitCode), note}
	}
	return []string{e.Name, release, e.Verdict, countsCell(e.Blockers), fmt.Sprint(len(e.Warnings)), lockWindowCell(e.LockWindowMS), fmt.Sprint(e.ExitCode), note}
}

// UnreachedHeader and UnreachedRow: the targets that gave no answer.
func UnreachedHeader() []string { return []string{"target", "verdict", "exit", "cause"} }

// UnreachedRow is e under UnreachedHeader.
func UnreachedRow(e *Entry) []string {
	code := fmt.Sprint(e.ExitCode)
	if e.Status == StatusNotStarted && e.Verdict != VerdictMissing {
		code = "-"
	}
	return []string{e.Name, e.Verdict, code, strings.TrimSpace(e.Cause + " " + e.Note)}
}

func countsCell(cs []Count) string {
	if len(cs) == 0 {
		return "0"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s (%d)", c.Check, c.Count)
	}
	return strings.Join(parts, ", ")
}

func lockWindowCell(ms *int64) string {
	if ms == nil {
		return "-"
	}
	if *ms < 1000 {
		return fmt.Sprintf("%d ms", *ms)
	}
	return (time.Duration(*ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}

// HeadLine is the fleet's first line: its verdict, counts and exit code.
func (r *Report) HeadLine() string {
	return fmt.Sprintf("%s: %s (exit %d)", r.Verdict, r.CountsLine(), r.ExitCode)
}

// Markdown writes the report for a CI job summary or a pull-request
// comment: the verdict, one section per state group, one for the targets
// that gave no answer.
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "## pgflow-upgrade fleet %s: %s\n\n", r.Command, r.Verdict)
	fmt.Fprintf(&b, "%s (exit %d)\n\n", r.CountsLine(), r.ExitCode)
	for _, s := range r.Stopped {
		fmt.Fprintf(&b, "> stopped: %s\n\n", mdText(s))
	}
	for _, g := range r.Groups {
		fmt.Fprintf(&b, "### %s\n\n%s\n\n", mdText(g.Title()), mdText(g.Describe()))
		var rows [][]string
		for _, name := range g.Targets {
			rows = append(rows, r.Row(r.Entry(name)))
		}
		mdTable(&b, r.Header(), rows)
	}
	if len(r.Unreached) > 0 {
		fmt.Fprintf(&b, "### No answer (%d)\n\n", len(r.Unreached))
		var rows [][]string
		for _, name := range r.Unreached {
			rows = append(rows, UnreachedRow(r.Entry(name)))
		}
		mdTable(&b, UnreachedHeader(), rows)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func mdTable(b *strings.Builder, header []string, rows [][]string) {
	line := func(cells []string) {
		for i := range cells {
			cells[i] = mdText(cells[i])
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	line(append([]string(nil), header...))
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	b.WriteString("|" + strings.Join(sep, "|") + "|\n")
	for _, r := range rows {
		line(r)
	}
	b.WriteString("\n")
}

// mdText escapes what Markdown would read as markup in a table cell.
func mdText(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	r := strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;", "*", `\*`, "_", `\_`, "`", "\\`", "[", `\[`)
	return r.Replace(s)
}

type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Body    string `xml:",chardata"`
}

// JUnit writes one test case per target: failed when its exit code is not
// 0, skipped when it was not started or not run.
func (r *Report) JUnit(w io.Writer) error {
	s := junitSuite{Name: "pgflow-upgrade fleet " + r.Command, Tests: len(r.Entries)}
	var total time.Duration
	for i := range r.Entries {
		e := &r.Entries[i]
		var d time.Duration
		if e.StartedAt != nil && e.FinishedAt != nil {
			d = e.FinishedAt.Sub(*e.StartedAt)
			total += d
		}
		c := junitCase{Name: e.Name, Classname: "fleet." + r.Command, Time: fmt.Sprintf("%.3f", d.Seconds()),
			SystemOut: strings.Join(nonEmpty([]string{e.Database, e.Summary, e.Note}), "\n")}
		msg := fmt.Sprintf("%s (exit %d)", e.Verdict, e.ExitCode)
		switch {
		case e.Status == StatusNotStarted:
			s.Skipped++
			c.Skipped = &junitMessage{Message: e.Verdict + ": " + e.Cause}
		case e.ExitCode != 0:
			s.Failures++
			body := e.Cause
			if len(e.Blockers) > 0 {
				body = strings.TrimSpace("blockers: " + countsCell(e.Blockers) + "\n" + body)
			}
			c.Failure = &junitMessage{Message: msg, Type: e.Verdict, Body: body}
		}
		s.Cases = append(s.Cases, c)
	}
	s.Time = fmt.Sprintf("%.3f", total.Seconds())
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(s); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
