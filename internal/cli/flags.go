package cli

import (
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Flags where people type them. urfave/cli v2 parses a command's flags only
// up to its first positional argument, and a flag only at the level that
// defines it. Two steps make every form work:
//
//  1. prepareCommands gives every command and subcommand the global flags
//     (--dsn, --format) it does not define itself, one usage-error handler, a
//     --format check, the required-flag check and, for a command without
//     ArgsUsage, "takes no arguments".
//  2. normalizeArgs rewrites the command line before urfave sees it: the
//     command path first, then every flag in the order typed, then the
//     positional arguments. As all flags land on the leaf command, a flag
//     given twice (before and after the subcommand) keeps the last one: the
//     nearest to the leaf wins.
//
// A command that adds a flag needs nothing else: whether it takes a value is
// read from its type (a BoolFlag does not).

// globalFlags are the flags every command takes (README "Global flags").
func globalFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "dsn", Usage: "PostgreSQL connection string (URL or key=value); default PGFLOW_UPGRADE_DSN, then DATABASE_URL, then libpq PG* variables"},
		&ucli.StringFlag{Name: "format", Value: "table", Usage: "output format: table or json"},
	}
}

// prepareCommands applies step 1 to cmds and their subcommands; parent is
// the command path above them ("pgflow-upgrade fixtures").
func (a *App) prepareCommands(cmds []*ucli.Command, parent string) {
	for _, cmd := range cmds {
		path := parent + " " + cmd.Name
		have := map[string]bool{}
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				have[n] = true
			}
		}
		for _, g := range globalFlags() {
			if !have[g.Names()[0]] {
				cmd.Flags = append(cmd.Flags, g)
			}
		}
		required := takeRequired(cmd.Flags)
		noArgs := cmd.ArgsUsage == "" && len(cmd.Subcommands) == 0
		own := cmd.Before
		markdown := strings.HasPrefix(path, "pgflow-upgrade fleet") // the fleet's reports also print Markdown
		cmd.Before = func(c *ucli.Context) error {
			if err := a.checkFormat(c, markdown); err != nil {
				return err
			}
			for _, name := range required {
				if !c.IsSet(name) {
					return usageErrorf("%s: missing required flag --%s", strings.TrimPrefix(path, "pgflow-upgrade "), name)
				}
			}
			if noArgs && c.NArg() > 0 {
				return usageErrorf("%s takes no arguments (got %q)", strings.TrimPrefix(path, "pgflow-upgrade "), c.Args().Slice())
			}
			if own != nil {
				return own(c)
			}
			return nil
		}
		if act := cmd.Action; act != nil {
			cmd.Action = func(c *ucli.Context) error {
				a.parsing.release() // app.go: urfave's parsing is over
				return act(c)
			}
		}
		cmd.OnUsageError = func(_ *ucli.Context, err error, _ bool) error {
			return usageErrorf("%s: %s", strings.TrimPrefix(path, "pgflow-upgrade "), flagError(err))
		}
		a.prepareCommands(cmd.Subcommands, path)
	}
}

// checkGlobal validates the global flags as the command sees them and
// records --dsn so errors can be redacted.
func (a *App) checkGlobal(c *ucli.Context) error { return a.checkFormat(c, false) }

// checkFormat is checkGlobal for a command that may also print Markdown.
func (a *App) checkFormat(c *ucli.Context, markdown bool) error {
	if d := c.String("dsn"); d != "" {
		a.dsnSeen = d
	}
	switch f := c.String("format"); {
	case f == "table", f == "json", f == "markdown" && markdown:
		return nil
	case markdown:
		return usageErrorf("--format %q: must be table, json or markdown", f)
	default:
		return usageErrorf("--format %q: must be table or json", f)
	}
}

// takeRequired turns urfave's required-flag check (which prints the whole
// help and exits 1) off and returns the names, checked in Before instead.
func takeRequired(flags []ucli.Flag) []string {
	var names []string
	for _, f := range flags {
		switch x := f.(type) {
		case *ucli.StringFlag:
			if x.Required {
				x.Required = false
				names = append(names, x.Name)
			}
		case *ucli.IntFlag:
			if x.Required {
				x.Required = false
				names = append(names, x.Name)
			}
		case *ucli.DurationFlag:
			if x.Required {
				x.Required = false
				names = append(names, x.Name)
			}
		case *ucli.StringSliceFlag:
			if x.Required {
				x.Required = false
				names = append(names, x.Name)
			}
		}
	}
	return names
}

// commandLine is a command line as urfave will see it.
type commandLine struct {
	args []string // the rewritten command line, args[0] the program
	path []string // the command path, e.g. ["fixtures", "load"]
}

// normalizeArgs is step 2. It returns a usage error for what urfave would
// answer badly: a value flag without its value, an unknown command or
// subcommand, a command that needs a subcommand and got none.
func normalizeArgs(app *ucli.App, args []string) (commandLine, error) {
	if len(args) == 0 {
		return commandLine{args: args}, nil
	}
	var (
		node     *ucli.Command // nil: the root
		chain    []*ucli.Command
		path     []string
		flags    []string
		pos      []string
		dashdash bool
		help     bool
	)
	subs := func() []*ucli.Command {
		if node == nil {
			return app.Commands
		}
		return node.Subcommands
	}
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		arg := rest[i]
		if arg == "--" {
			pos = append(pos, rest[i+1:]...)
			dashdash = true
			break
		}
		if strings.HasPrefix(arg, "-") && arg != "-" {
			name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
			if name == "help" || name == "h" {
				help = true
			}
			flags = append(flags, arg)
			if !hasValue && takesValue(app, chain, name) {
				if i+1 >= len(rest) {
					return commandLine{path: path}, usageErrorf("flag needs an argument: %s", arg)
				}
				i++
				flags = append(flags, rest[i])
			}
			continue
		}
		if len(pos) == 0 {
			if sub := findCommand(subs(), arg); sub != nil {
				node, chain, path = sub, append(chain, sub), append(path, sub.Name)
				continue
			}
		}
		pos = append(pos, arg)
	}
	if len(subs()) > 0 && !help {
		// A command with subcommands (or the root) does nothing itself.
		where := strings.Join(path, " ")
		if where != "" {
			where += ": "
		}
		switch {
		case len(pos) > 0 && (pos[0] == "help" || pos[0] == "h"):
			return commandLine{args: args, path: path}, nil // urfave's help command
		case len(pos) > 0:
			return commandLine{path: path}, usageErrorf("%sunknown command %q", where, pos[0])
		default:
			return commandLine{path: path}, usageErrorf("%smissing command (one of %s)", where, strings.Join(commandNames(subs()), ", "))
		}
	}
	if help {
		pos = nil // urfave would read them as a help topic
	}
	out := append([]string{args[0]}, path...)
	out = append(out, flags...)
	if dashdash || anyDash(pos) {
		out = append(out, "--")
	}
	out = append(out, pos...)
	return commandLine{args: out, path: path}, nil
}

func findCommand(cmds []*ucli.Command, name string) *ucli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func commandNames(cmds []*ucli.Command) []string {
	var out []string
	for _, c := range cmds {
		if !c.Hidden {
			out = append(out, c.Name)
		}
	}
	return out
}

func anyDash(args []string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			return true
		}
	}
	return false
}

// takesValue says whether the flag name takes a value: looked up on the
// commands of chain from the leaf up, then the root, then anywhere below the
// leaf (a flag typed before the subcommand that defines it). An unknown flag
// takes none: urfave reports it.
func takesValue(app *ucli.App, chain []*ucli.Command, name string) bool {
	for i := len(chain) - 1; i >= 0; i-- {
		if v, ok := flagTakesValue(chain[i].Flags, name); ok {
			return v
		}
	}
	if v, ok := flagTakesValue(app.Flags, name); ok {
		return v
	}
	below := app.Commands
	if len(chain) > 0 {
		below = chain[len(chain)-1].Subcommands
	}
	return takesValueBelow(below, name)
}

func takesValueBelow(cmds []*ucli.Command, name string) bool {
	for _, c := range cmds {
		if v, ok := flagTakesValue(c.Flags, name); ok {
			return v
		}
		if takesValueBelow(c.Subcommands, name) {
			return true
		}
	}
	return false
}

func flagTakesValue(flags []ucli.Flag, name string) (takes, found bool) {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if d, ok := f.(ucli.DocGenerationFlag); ok {
				return d.TakesValue(), true
			}
			return true, true
		}
	}
	return false, false
}

// flagError rewords the flag package's errors with the flag as typed
// (--name), not as Go spells it (-name).
func flagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "unknown flag --" + strings.TrimLeft(name, "-")
	}
	return strings.Replace(msg, " for flag -", " for flag --", 1)
}

// helpPointer is the hint every usage error ends with.
func helpPointer(path []string) string {
	return fmt.Sprintf("see `%s --help`", strings.Join(append([]string{"pgflow-upgrade"}, path...), " "))
}
