package cli

import (
	"encoding/json"
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
