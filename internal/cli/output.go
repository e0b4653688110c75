package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/mattn/go-runewidth"
	"github.com/olekukonko/tablewriter"
)

// tableWidth is the widest a table may print: it fits a common terminal.
// --format json (and replay's --junit) keep every detail unwrapped.
const tableWidth = 100

// minColumn is the narrowest a column is wrapped to.
const minColumn = 12

// writeJSON prints v as indented JSON followed by a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeTable prints rows under header with tablewriter, long cells wrapped
// so that the table fits tableWidth columns.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	rows = fitTable(header, rows, tableWidth)
	t := tablewriter.NewWriter(w)
	t.Header(header)
	for _, r := range rows {
		if err := t.Append(r); err != nil {
			return err
		}
	}
	return t.Render()
}

// fitTable narrows the widest column, one character at a time, until the
// table (borders and padding: 3 per column, plus 1) fits width, and wraps
// the cells of the columns it narrowed. Columns never go below
// minColumn (or their header).
func fitTable(header []string, rows [][]string, width int) [][]string {
	n := len(header)
	widths := make([]int, n)
	floor := make([]int, n)
	for i, h := range header {
		widths[i] = runewidth.StringWidth(h)
		floor[i] = max(widths[i], minColumn)
	}
	for _, r := range rows {
		for i := 0; i < n && i < len(r); i++ {
			for _, line := range strings.Split(r[i], "\n") {
				widths[i] = max(widths[i], runewidth.StringWidth(line))
			}
		}
	}
	limit := append([]int(nil), widths...)
	total := func() int {
		s := 3*n + 1
		for _, x := range limit {
			s += x
		}
		return s
	}
	for total() > width {
		widest := -1
		for i := range limit {
			if limit[i] > floor[i] && (widest < 0 || limit[i] > limit[widest]) {
				widest = i
			}
		}
		if widest < 0 {
			break // as narrow as it goes
		}
		limit[widest]-- // one at a time: the widest columns end up level
	}
	out := make([][]string, len(rows))
	for j, r := range rows {
		out[j] = append([]string(nil), r...)
		for i := 0; i < n && i < len(r); i++ {
			if limit[i] < widths[i] {
				out[j][i] = wrapCell(r[i], limit[i])
			}
		}
	}
	return out
}

// wrapCell breaks text at spaces so no line is wider than width, and breaks
// a word wider than width.
func wrapCell(text string, width int) string {
	var out []string
	for _, para := range strings.Split(text, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			for runewidth.StringWidth(word) > width {
				head := runewidth.Truncate(word, width, "")
				if head == "" {
					head = string([]rune(word)[:1])
				}
				if line != "" {
					out = append(out, line)
					line = ""
				}
				out = append(out, head)
				word = word[len(head):]
			}
			if line != "" && runewidth.StringWidth(line)+1+runewidth.StringWidth(word) > width {
				out = append(out, line)
				line = ""
			}
			if line != "" {
				line += " "
			}
			line += word
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// lineWidth is the width of the human output's text lines, the same as its
// tables.
const lineWidth = tableWidth

// writeBlock prints text as a paragraph: the first line starts with head
// (its leading spaces kept), the text is wrapped at lineWidth, and
// continuation lines are indented by indent spaces.
func writeBlock(w io.Writer, head, text string, indent int) {
	lead := len(head) - len(strings.TrimLeft(head, " "))
	pad := strings.Repeat(" ", indent)
	for i, line := range strings.Split(wrapCell(head[lead:]+text, lineWidth-max(lead, indent)), "\n") {
		if i == 0 {
			io.WriteString(w, head[:lead]+line+"\n")
		} else {
			io.WriteString(w, pad+line+"\n")
		}
	}
}

// oneLine is text on one line of at most width columns: line breaks become
// spaces and what does not fit is cut with "…" (--verbose and JSON keep it
// whole).
func oneLine(text string, width int) string {
	text = strings.Join(strings.Fields(text), " ")
	if runewidth.StringWidth(text) <= width {
		return text
	}
	return runewidth.Truncate(text, width, "…")
}

// withoutSelf rewrites a next step so that it never tells the person to run
// the command they are running: "run `pgflow-upgrade audit`, then
// `pgflow-upgrade apply`" read inside audit becomes "run `pgflow-upgrade
// apply`", and a trailing ", then run `pgflow-upgrade audit`" is dropped.
func withoutSelf(step, command string) string {
	self := "`pgflow-upgrade " + command + "`"
	if !strings.Contains(step, self) {
		return step
	}
	for _, r := range []struct{ from, to string }{
		{"run " + self + ", then ", "run "},
		{"run " + self + " and then ", "run "},
		{", then run " + self, ""},
		{" then run " + self, ""},
		{" and run " + self, ""},
		{"; run " + self, ""},
	} {
		step = strings.ReplaceAll(step, r.from, r.to)
	}
	if strings.Contains(step, self) {
		// A phrasing not listed above: name it as what this run is.
		step = strings.ReplaceAll(step, self, "this "+command)
	}
	return step
}

// plural is "1 warning" or "2 warnings".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
