package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	ucli "github.com/urfave/cli/v2"
)

// TestEveryHelpListsEveryFlag walks the command tree: each command's --help
// names every flag the command takes, the global ones included.
func TestEveryHelpListsEveryFlag(t *testing.T) {
	var walk func(path []string, cmds []*ucli.Command)
	walk = func(path []string, cmds []*ucli.Command) {
		for _, c := range cmds {
			p := append(append([]string(nil), path...), c.Name)
			var out, errOut bytes.Buffer
			a := &App{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
			if code := a.Run(context.Background(), append(append([]string{"pgflow-upgrade"}, p...), "--help")); code != ExitOK {
				t.Errorf("%v --help: exit %d: %s", p, code, errOut.String())
			}
			for _, want := range []string{"--dsn", "--format"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("%v --help does not list the global flag %s", p, want)
				}
			}
			for _, f := range c.Flags {
				if !strings.Contains(out.String(), "--"+f.Names()[0]) {
					t.Errorf("%v --help does not list --%s:\n%s", p, f.Names()[0], out.String())
				}
			}
			walk(p, c.Subcommands)
		}
	}
	a := &App{Getenv: func(string) string { return "" }}
	walk(nil, a.build().Commands)
}

// TestNormalizeArgs shows the rewrite itself.
func TestNormalizeArgs(t *testing.T) {
	app := (&App{}).build()
	cases := []struct{ in, want string }{
		{"fixtures load inflight --dsn X", "fixtures load --dsn X inflight"},
		{"--dsn X fixtures --format json load inflight", "fixtures load --dsn X --format json inflight"},
		{"audit --check a --sample=3 --check b", "audit --check a --sample=3 --check b"},
		{"apply --yes --dry-run --wait 1s", "apply --yes --dry-run --wait 1s"},
		{"fixtures replay a --junit f b", "fixtures replay --junit f a b"},
		{"fixtures replay -- -odd", "fixtures replay -- -odd"},
		{"--junit f fixtures replay a", "fixtures replay --junit f a"}, // a subcommand's flag typed early
	}
	for _, c := range cases {
		got, err := normalizeArgs(app, append([]string{"p"}, strings.Fields(c.in)...))
		if err != nil || strings.Join(got.args[1:], " ") != c.want {
			t.Errorf("%q: got %q (%v), want %q", c.in, got.args, err, c.want)
		}
	}
}
