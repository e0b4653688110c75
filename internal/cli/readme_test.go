package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mattn/go-runewidth"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// readmeExamples returns, per ```sh block of the README, its pgflow-upgrade
// command lines (comments removed).
func readmeExamples(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			blocks = append(blocks, nil)
		case strings.HasPrefix(line, "```"):
			in = false
		case in && strings.HasPrefix(line, "pgflow-upgrade "):
			if i := strings.Index(line, " #"); i >= 0 {
				line = line[:i]
			}
			blocks[len(blocks)-1] = append(blocks[len(blocks)-1], strings.TrimSpace(line))
		}
	}
	return blocks
}

// shellWords splits a command line as sh would for the README's examples:
// words, "double" and 'single' quotes, $NAME expanded from env.
func shellWords(line string, env map[string]string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	expand := func(s string) string { return os.Expand(s, func(k string) string { return env[k] }) }
	pending := ""
	flushPending := func() {
		if pending != "" {
			cur.WriteString(expand(pending))
			pending = ""
		}
	}
	for _, r := range line {
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			if r == '"' {
				flushPending()
				quote = 0
			} else {
				pending += string(r)
			}
		case r == '\'' || r == '"':
			flushPending()
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			flushPending()
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			pending += string(r)
			inWord = true
		}
	}
	flushPending()
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestReadmeExamples runs every pgflow-upgrade command line of the README,
// in order, each ```sh block against a fresh pgflow 0.16.0 database with
// in-flight work ($URL, also PGFLOW_UPGRADE_DSN as the README exports it)
// and a fresh empty one ($EMPTY_URL), in a scratch directory. Each must
// exit 0 and print something, its tables at most 100 columns wide.
func TestReadmeExamples(t *testing.T) {
	testdb.SkipIfShort(t, "runs every pgflow-upgrade command line of the README, in order, each '''sh block against a fresh pgflow...")
	blocks := readmeExamples(t)
	n := 0
	for _, b := range blocks {
		n += len(b)
	}
	if n < 10 {
		t.Fatalf("found only %d examples in README.md: the parser is broken", n)
	}
	t.Chdir(t.TempDir()) // files the examples write (capture.jsonl, replay.xml)
	for _, block := range blocks {
		if len(block) == 0 {
			continue
		}
		db, empty := testdb.Inflight(t, 3), testdb.Empty(t)
		env := map[string]string{"URL": db.DSN, "DSN": db.DSN, "EMPTY_URL": empty.DSN, "PGFLOW_UPGRADE_DSN": db.DSN}
		// The fleet examples' targets file: the block's database.
		if err := os.WriteFile("targets.txt", []byte("app "+db.DSN+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, line := range block {
			args := shellWords(line, env)
			r := clitest.Run(t, env, args[1:]...)
			if r.Code != cli.ExitOK || strings.TrimSpace(r.Stdout) == "" {
				t.Errorf("README example %q: exit %d\n%s%s", line, r.Code, r.Stdout, r.Stderr)
			}
			for _, l := range strings.Split(r.Stdout, "\n") {
				if strings.ContainsAny(l, "│┌└├") && runewidth.StringWidth(l) > 100 {
					t.Errorf("README example %q: a table line of %d columns:\n%s", line, runewidth.StringWidth(l), r.Stdout)
					break
				}
			}
		}
	}
}

// TestReadmeListsEveryFlag: the README's flag tables name every flag of
// every command (a flag added to a command must be documented there).
func TestReadmeListsEveryFlag(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range [][]string{{"audit"}, {"apply"}, {"status"}, {"verify"}, {"version"},
		{"fixtures", "list"}, {"fixtures", "load"}, {"fixtures", "replay"}, {"fixtures", "capture"},
		{"fleet", "audit"}, {"fleet", "status"}, {"fleet", "verify"}, {"fleet", "apply"}, {"fleet", "report"}} {
		r := clitest.Run(t, nil, append(path, "--help")...)
		_, options, ok := strings.Cut(r.Stdout, "OPTIONS:")
		if !ok {
			t.Fatalf("%v --help has no OPTIONS:\n%s", path, r.Stdout)
		}
		for _, line := range strings.Split(options, "\n") {
			// A flag's line: "   --name value   usage"; wrapped usage lines
			// are indented further.
			f := strings.Fields(line)
			if !strings.HasPrefix(line, "   --") || f[0] == "--help," {
				continue
			}
			if !strings.Contains(string(b), "`"+f[0]) {
				t.Errorf("%v: README.md does not document %s", path, f[0])
			}
		}
	}
}
