package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// Findings and their samples, as every command's table shows them: audit's
// --verbose, apply's blockers and warnings, apply --online's blockers.

// findingColumns head writeFindings' table.
var findingColumns = []string{"check", "count", "finding", "remedy"}

// findingRow is one finding as a row of findingColumns.
func findingRow(f audit.Finding) []string {
	return []string{f.CheckID, countCell(f), f.Message, f.Remedy}
}

// writeFindings prints findings as a table of findingColumns.
func writeFindings(w io.Writer, findings []audit.Finding) error {
	var rows [][]string
	for _, f := range findings {
		rows = append(rows, findingRow(f))
	}
	return writeTable(w, findingColumns, rows)
}

// writeBlockers prints the blockers that stopped a run (apply, apply
// --online): what to do about them, then their table.
func writeBlockers(w io.Writer, blockers []audit.Finding) error {
	fmt.Fprintln(w, "\nblockers (fix them, then rerun; `pgflow-upgrade audit` shows the same checks):")
	return writeFindings(w, blockers)
}

// writeFindingSamples prints, for every finding that has samples, a line
// "title (samples)" and the samples' table.
func writeFindingSamples(w io.Writer, findings []audit.Finding, title func(audit.Finding) string) error {
	for _, f := range findings {
		if len(f.Samples) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (samples)\n", title(f))
		if err := writeSamples(w, f.Samples); err != nil {
			return err
		}
	}
	return nil
}

// writeSamples prints the sample rows of one finding as a table, one
// column per key (sampleColumns).
func writeSamples(w io.Writer, samples []map[string]any) error {
	cols := sampleColumns(samples)
	var rows [][]string
	for _, s := range samples {
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = cell(s[c])
		}
		rows = append(rows, row)
	}
	return writeTable(w, cols, rows)
}

// countCell is a finding's count ("at least N" when the check stopped at
// its bound).
func countCell(f audit.Finding) string {
	if f.AtLeast {
		return fmt.Sprintf("at least %d", f.Count)
	}
	return fmt.Sprint(f.Count)
}

// sampleText is a sample row as "column=value" pairs in column order.
func sampleText(s map[string]any) string {
	cols := sampleColumns([]map[string]any{s})
	parts := make([]string, 0, len(cols))
	for _, c := range cols {
		parts = append(parts, c+"="+cell(s[c]))
	}
	return strings.Join(parts, ", ")
}

// sampleColumns: the union of the samples' keys, sorted.
func sampleColumns(samples []map[string]any) []string {
	seen := map[string]bool{}
	var cols []string
	for _, s := range samples {
		for k := range s {
			if !seen[k] {
				seen[k] = true
				cols = append(cols, k)
			}
		}
	}
	sort.Strings(cols)
	return cols
}

// cell is a sample value as text (JSON for objects and arrays).
func cell(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case map[string]any, []any:
		b, _ := json.Marshal(x)
		return string(b)
	}
	return fmt.Sprint(v)
}
