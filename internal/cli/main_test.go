package cli_test

import (
	"os"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// cellText is out with the cells of wrapped table rows joined again, one
// row a line, cells separated by " | ", followed by the whole of out as
// one line (words joined by single spaces, for the paragraphs the human
// output wraps at 100 columns): a test looks for a phrase in it whatever
// the column width or the paragraph cut it into. A row starts at a line
// whose first cell is not empty.
func cellText(out string) string {
	return tableText(out) + "\n" + strings.Join(strings.Fields(out), " ")
}

func tableText(out string) string {
	var lines []string
	var row []string
	flush := func() {
		if row != nil {
			lines = append(lines, strings.Join(row, " | "))
			row = nil
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "│") {
			flush()
			lines = append(lines, line)
			continue
		}
		cells := strings.Split(strings.Trim(line, "│"), "│")
		if strings.TrimSpace(cells[0]) != "" || len(row) != len(cells) {
			flush()
			row = make([]string, len(cells))
		}
		for i, c := range cells {
			if c = strings.TrimSpace(c); c != "" {
				row[i] = strings.TrimSpace(row[i] + " " + c)
			}
		}
	}
	flush()
	return strings.Join(lines, "\n")
}
