package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
)

// unreachable is a DSN whose connection fails at once: a command that
// answers "connecting to u@127.0.0.1:1/x" has read --dsn where it was typed.
const unreachable = "postgres://u:flagtestpw@127.0.0.1:1/x?connect_timeout=2"

// leaf is a command as a user types it: path, positional arguments and
// flags of its own that let it get as far as connecting.
type leaf struct {
	path  []string
	args  []string
	flags []string
}

func leaves(t *testing.T) []leaf {
	out := filepath.Join(t.TempDir(), "capture.jsonl")
	return []leaf{
		{path: []string{"audit"}},
		{path: []string{"apply"}, flags: []string{"--yes"}},
		{path: []string{"status"}},
		{path: []string{"verify"}},
		{path: []string{"fixtures", "load"}, args: []string{"baseline"}},
		{path: []string{"fixtures", "replay"}, args: []string{"clean-upgrade"}},
		{path: []string{"fixtures", "capture"}, flags: []string{"--out", out}},
	}
}

func cat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestFlagPositions: --dsn and --format before the command, between a
// command and its subcommand, after the subcommand, after the positional
// arguments; the command's own flags after the positional arguments; the
// nearest of two wins.
func TestFlagPositions(t *testing.T) {
	dsn := []string{"--dsn", unreachable}
	yaml := []string{"--format", "yaml"}
	for _, l := range leaves(t) {
		name := strings.Join(l.path, " ")
		forms := map[string][]string{
			"global before the command":      cat(dsn, l.path, l.args, l.flags),
			"global after the command":       cat(l.path, dsn, l.args, l.flags),
			"everything after the arguments": cat(l.path, l.args, l.flags, dsn),
			"--dsn=value form":               cat(l.path, l.args, []string{"--dsn=" + unreachable}, l.flags),
			"nearest --dsn wins":             cat([]string{"--dsn", "postgres://u@127.0.0.1:2/other"}, l.path, l.args, l.flags, dsn),
		}
		if len(l.path) == 2 {
			forms["global between command and subcommand"] = cat(l.path[:1], dsn, l.path[1:], l.args, l.flags)
		}
		for form, args := range forms {
			r := clitest.Run(t, nil, args...)
			if r.Code != cli.ExitEnvironment || !strings.Contains(r.Stderr, "u@127.0.0.1:1/x") {
				t.Errorf("%s, %s %q: exit %d, want %d connecting to 127.0.0.1:1\n%s", name, form, args, r.Code, cli.ExitEnvironment, r.Stderr)
			}
			if strings.Contains(r.Stdout+r.Stderr, "flagtestpw") {
				t.Errorf("%s, %s: password printed", name, form)
			}
		}
		// --format reaches the command wherever it is typed: a bad value is
		// refused (2) naming it, before any connection.
		for form, args := range map[string][]string{
			"--format before":          cat(yaml, l.path, l.args, l.flags, dsn),
			"--format after":           cat(l.path, yaml, l.args, l.flags, dsn),
			"--format after arguments": cat(l.path, l.args, l.flags, dsn, yaml),
		} {
			r := clitest.Run(t, nil, args...)
			if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, `--format "yaml"`) {
				t.Errorf("%s, %s: exit %d, want %d naming --format\n%s", name, form, r.Code, cli.ExitUsage, r.Stderr)
			}
		}
	}
	// Commands that need no database: the output shows the format chosen.
	for _, args := range [][]string{
		{"--format", "json", "version"},
		{"version", "--format", "json"},
		{"--format", "table", "version", "--format", "json"}, // nearest wins
		{"--format", "json", "fixtures", "list"},
		{"fixtures", "--format", "json", "list"},
		{"fixtures", "list", "--format=json"},
	} {
		r := clitest.Run(t, nil, args...)
		if r.Code != cli.ExitOK || !json.Valid([]byte(r.Stdout)) {
			t.Errorf("%q: exit %d, output not JSON:\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	// A command's own flag after its positional argument: replay's
	// --parallel is read (and refused) after the scenario name.
	r := clitest.Run(t, nil, "fixtures", "replay", "clean-upgrade", "--parallel", "0")
	if r.Code != cli.ExitUsage || !strings.Contains(r.Stderr, "--parallel") {
		t.Errorf("replay NAME --parallel 0: exit %d\n%s", r.Code, r.Stderr)
	}
}

// TestUsageErrorsExit2OneLine: every usage error, for every command, exits 2
// with one line that names what was wrong and points at that command's --help.
func TestUsageErrorsExit2OneLine(t *testing.T) {
	type usage struct {
		args []string
		says string // what was wrong
		help string // the --help pointed at
	}
	var cases []usage
	for _, l := range append(leaves(t), leaf{path: []string{"version"}}, leaf{path: []string{"fixtures", "list"}}) {
		name := strings.Join(l.path, " ")
		cases = append(cases,
			usage{cat(l.path, l.args, l.flags, []string{"--no-such-flag"}), "unknown flag --no-such-flag", name},
			usage{cat([]string{"--no-such-flag"}, l.path, l.args, l.flags), "unknown flag --no-such-flag", name},
			usage{cat(l.path, l.args, l.flags, []string{"--dsn"}), "flag needs an argument: --dsn", name},
			usage{cat(l.path, l.args, l.flags, []string{"--format", "xml"}), `--format "xml"`, name},
		)
	}
	cases = append(cases,
		// missing or extra arguments
		usage{[]string{"audit", "extra"}, "takes no arguments", "audit"},
		usage{[]string{"apply", "--yes", "extra"}, "takes no arguments", "apply"},
		usage{[]string{"status", "extra"}, "takes no arguments", "status"},
		usage{[]string{"verify", "extra"}, "takes no arguments", "verify"},
		usage{[]string{"version", "extra"}, "takes no arguments", "version"},
		usage{[]string{"fixtures", "list", "extra"}, "takes no arguments", "fixtures list"},
		usage{[]string{"fixtures", "capture", "--out", "x", "extra"}, "takes no arguments", "fixtures capture"},
		usage{[]string{"fixtures", "load"}, "exactly one state name", "fixtures load"},
		usage{[]string{"fixtures", "load", "baseline", "inflight"}, "exactly one state name", "fixtures load"},
		usage{[]string{"fixtures", "capture"}, "missing required flag --out", "fixtures capture"},
		usage{[]string{"fixtures"}, "missing command", "fixtures"},
		usage{[]string{}, "missing command", ""},
		usage{[]string{"fixtures", "nope"}, `unknown command "nope"`, "fixtures"},
		usage{[]string{"nope"}, `unknown command "nope"`, ""},
		// bad values
		usage{[]string{"audit", "--sample", "abc"}, `invalid value "abc" for flag --sample`, "audit"},
		usage{[]string{"audit", "--sample", "-1"}, "--sample -1", "audit"},
		usage{[]string{"apply", "--wait", "soon", "--yes"}, "--wait", "apply"},
		usage{[]string{"apply", "--yes", "--lock-timeout", "0s"}, "must be positive", "apply"},
		usage{[]string{"fixtures", "replay", "--parallel", "0"}, "--parallel", "fixtures replay"},
		usage{[]string{"fixtures", "load", "no-such-state"}, "no-such-state", "fixtures load"},
		// conflicting flags
		usage{[]string{"apply", "--yes", "--online", "--rollback-online"}, "exclude each other", "apply"},
		usage{[]string{"apply", "--yes", "--online", "--dry-run"}, "--dry-run", "apply"},
		// apply off a terminal without --yes
		usage{[]string{"apply", "--dsn", unreachable}, "--yes", "apply"},
	)
	for _, c := range cases {
		r := clitest.Run(t, nil, c.args...)
		lines := strings.Split(strings.TrimSuffix(r.Stderr, "\n"), "\n")
		help := strings.Join(strings.Fields("pgflow-upgrade "+c.help+" --help"), " ")
		switch {
		case r.Code != cli.ExitUsage:
			t.Errorf("%q: exit %d, want %d\n%s", c.args, r.Code, cli.ExitUsage, r.Stderr)
		case len(lines) != 1:
			t.Errorf("%q: %d lines on stderr, want one:\n%s", c.args, len(lines), r.Stderr)
		case !strings.Contains(r.Stderr, c.says) || !strings.Contains(r.Stderr, "`"+help+"`"):
			t.Errorf("%q: %q should say %q and point at `%s`", c.args, r.Stderr, c.says, help)
		}
		if r.Stdout != "" {
			t.Errorf("%q: a usage error printed on stdout:\n%s", c.args, r.Stdout)
		}
	}
}

// TestHelpEverywhere: --help and -h work at every level, in every position,
// and exit 0.
func TestHelpEverywhere(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"}, {"help", "audit"}, {"audit", "--help"}, {"--help", "audit"},
		{"fixtures", "--help"}, {"fixtures", "load", "--help"}, {"fixtures", "load", "baseline", "--help"},
		{"fixtures", "replay", "clean-upgrade", "-h"}, {"apply", "--dsn", unreachable, "--help"},
	} {
		r := clitest.Run(t, nil, args...)
		if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "USAGE") {
			t.Errorf("%q: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
}
