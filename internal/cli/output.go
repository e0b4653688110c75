package cli

import (
	"encoding/json"
	"io"

	"github.com/olekukonko/tablewriter"
)

// writeJSON prints v as indented JSON followed by a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeTable prints rows under header with tablewriter.
func writeTable(w io.Writer, header []string, rows [][]string) error {
	t := tablewriter.NewWriter(w)
	t.Header(header)
	for _, r := range rows {
		if err := t.Append(r); err != nil {
			return err
		}
	}
	return t.Render()
}
