// Package cli is the pgflow-upgrade command line: global flags, exit codes,
// output formats and one file per command (cmd_<name>.go). cmd/pgflow-upgrade
// only wires the process into App, so tests run every command in-process and
// read what it printed.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	ucli "github.com/urfave/cli/v2"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Version is the tool version, set at build time with
// -ldflags "-X github.com/pgflow-upgrade/pgflow-upgrade/internal/cli.Version=v1.2.3".
var Version = "dev"

// App is one invocation of the tool.
type App struct {
	Stdout io.Writer
	Stderr io.Writer
	Stdin  io.Reader
	// Getenv reads the environment (os.Getenv by default); tests replace it.
	Getenv func(string) string
	// Interactive says stdin/stdout are a terminal (prompts, progress).
	Interactive bool

	// heartbeatEvery overrides the progress heartbeat's interval (tests).
	heartbeatEvery time.Duration

	// dsnSeen is the DSN given on the command line, so errors can be redacted.
	dsnSeen string
	// warnedPin: the note about a pooler that refuses search_path is printed once.
	warnedPin bool
	// parsing is held from the start of Run until the command's action
	// starts (see urfaveMu).
	parsing *parseLock
}

// urfaveMu serialises what urfave/cli v2 does before a command's action
// starts: while it sets up and parses it writes package-level values (the
// help flag and help command every app shares), so two Apps of one
// process (a fleet's targets, run in-process) must not parse at the same
// time. Their actions run in parallel.
var urfaveMu sync.Mutex

// parseLock is urfaveMu as one Run holds it: released once, when the
// action starts or, for help and usage errors, when Run returns.
type parseLock struct{ once sync.Once }

func (p *parseLock) release() {
	if p != nil { // nil: an App driven without Run (tests of the parser)
		p.once.Do(urfaveMu.Unlock)
	}
}

// Run executes args (args[0] is the program name) and returns the exit code.
func (a *App) Run(ctx context.Context, args []string) int {
	if a.Getenv == nil {
		a.Getenv = os.Getenv
	}
	if a.Stdin == nil {
		a.Stdin = strings.NewReader("")
	}
	defer a.reportPeakRSS()
	urfaveMu.Lock()
	a.parsing = &parseLock{}
	defer a.parsing.release()
	app := a.build()
	line, err := normalizeArgs(app, args) // flags.go
	if err == nil {
		err = app.RunContext(ctx, line.args)
	}
	if err == nil {
		return ExitOK
	}
	if !isReported(err) {
		// A lost server, a full disk, a server timeout: said the same way
		// for every command (failure.go).
		err = explainRunFailure(err, strings.Join(line.path, " "))
	}
	code := exitCode(err)
	if code == ExitOK || isReported(err) {
		return code
	}
	msg := err.Error()
	if !errors.Is(err, session.ErrMalformed) {
		// A malformed DSN's message is fixed text (session/malformed.go): the
		// password spellings guessed from such a string can be one letter,
		// and replacing those everywhere garbles the message.
		msg = a.redact(msg)
	}
	if code == ExitUsage {
		// One line, naming what was wrong and where to read more.
		msg = strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", "; ")), " ")
		if !strings.Contains(msg, "--help") {
			msg += " (" + helpPointer(line.path) + ")"
		}
	}
	fmt.Fprintf(a.Stderr, "pgflow-upgrade: %s\n", msg)
	return code
}

// reportedError marks an error whose details the command already printed.
type reportedError struct{ error }

func (r reportedError) Unwrap() error { return r.error } // keeps the ExitError inside reachable

func isReported(err error) bool {
	var r reportedError
	return errors.As(err, &r)
}

// redact removes any password the user gave us from text.
func (a *App) redact(text string) string {
	for _, d := range []string{a.Getenv("PGFLOW_UPGRADE_DSN"), a.Getenv("DATABASE_URL"), a.dsnSeen} {
		if d != "" {
			text = session.RedactText(text, d)
		}
	}
	if pw := a.Getenv("PGPASSWORD"); pw != "" {
		text = strings.ReplaceAll(text, pw, "xxxxx")
	}
	return text
}

func (a *App) build() *ucli.App {
	app := &ucli.App{
		Name:  "pgflow-upgrade",
		Usage: "take a pgflow 0.16.0 database to pgflow 0.17.0 safely",
		Description: "Exit codes: 0 success, 1 findings or refusal, 2 usage error, 3 connection or environment error,\n" +
			"4 inconclusive (a check ran out of time: examined N of about M rows), 130 interrupted.",
		Version:              Version,
		Writer:               a.Stdout,
		ErrWriter:            a.Stderr,
		Reader:               a.Stdin,
		HideVersion:          true,
		EnableBashCompletion: false,
		Flags:                globalFlags(),
		Before:               a.checkGlobal,
		OnUsageError: func(c *ucli.Context, err error, _ bool) error {
			return usageErrorf("%s", flagError(err))
		},
		ExitErrHandler: func(*ucli.Context, error) {}, // never os.Exit from inside: Run returns the code
		Commands: []*ucli.Command{
			a.versionCommand(),
			a.fixturesCommand(),
			a.auditCommand(),
			a.applyCommand(),
			a.statusCommand(),
			a.verifyCommand(),
			a.fleetCommand(),
		},
	}
	a.prepareCommands(app.Commands, "pgflow-upgrade") // flags.go
	return app
}

// target is a resolved database target.
type target struct {
	resolved session.Resolved
	config   *pgx.ConnConfig
	command  string // for messages
}

// resolveTarget reads --dsn and the environment. With allowNone false, a
// missing DSN is a usage error that says how to give one.
func (a *App) resolveTarget(c *ucli.Context, command string, allowNone bool) (*target, error) {
	return a.resolveWith(c.String("dsn"), command, allowNone)
}

// resolveWith resolves a DSN given as value (a flag of the command itself, or
// the global --dsn) and prepares the connection settings every command
// shares.
func (a *App) resolveWith(value, command string, allowNone bool) (*target, error) {
	if value != "" {
		a.dsnSeen = value
	}
	r := session.Resolve(value, a.Getenv)
	if r.Source == session.SourceNone {
		if allowNone {
			return &target{resolved: r}, nil
		}
		return nil, usageErrorf("no database given: pass --dsn, or set PGFLOW_UPGRADE_DSN, DATABASE_URL or the libpq PG* variables")
	}
	cfg, err := session.Config(r.DSN, session.Options{Purpose: session.Tool, Name: command})
	if err != nil {
		return nil, withCode(ExitUsage, fmt.Errorf("connection string from %s: %w; give a postgres:// URL or key=value pairs (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-CONNSTRING)", r.Source, err))
	}
	return &target{resolved: r, config: cfg, command: command}, nil
}

// openTarget is the start of every command that works on one database given by
// --dsn or the environment: the target resolved (a missing DSN is a usage error)
// and one connection opened to it. The caller closes the connection.
func (a *App) openTarget(c *ucli.Context, command string) (*pgx.Conn, *target, error) {
	t, err := a.resolveTarget(c, command, false)
	if err != nil {
		return nil, nil, err
	}
	conn, err := a.connect(c.Context, t)
	if err != nil {
		return nil, nil, err
	}
	return conn, t, nil
}

// connectNoArgs is the start of the commands that take no arguments and one
// connection (status, verify): the usage check, the connection, and the target
// as printed (no password).
func (a *App) connectNoArgs(c *ucli.Context, command string) (conn *pgx.Conn, where string, err error) {
	if c.NArg() > 0 {
		return nil, "", usageErrorf("%s takes no arguments (got %q)", command, c.Args().Slice())
	}
	conn, t, err := a.openTarget(c, command)
	if err != nil {
		return nil, "", err
	}
	return conn, session.Describe(t.config), nil
}

// connect opens one connection to the target, a session of the tool
// (session.Tool: search_path pinned).
func (a *App) connect(ctx context.Context, t *target) (*pgx.Conn, error) {
	conn, perTransaction, err := session.Connect(ctx, t.config)
	if perTransaction && !a.warnedPin {
		a.warnedPin = true
		fmt.Fprintln(a.Stderr, "pgflow-upgrade: note: the server (a pooler) refused the search_path startup parameter: search_path is pinned in each transaction only, "+
			"statements outside one run with the pooler session's path; let the pooler pass it (PgBouncer 1.20+: track_extra_parameters = search_path)")
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, withCode(ExitEnvironment, fmt.Errorf("connecting to %s (%s): %s; %s", session.Describe(t.config), t.resolved.Source, a.redact(err.Error()), connectHint(err)))
	}
	return conn, nil
}

// connectHint says what to do about a failed connection, by SQLSTATE.
func connectHint(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01":
			return "check the password (in the DSN or PGPASSWORD)"
		case "28000":
			return "check the role: it needs LOGIN (ALTER ROLE ... LOGIN) and a pg_hba.conf entry that lets it connect from here"
		case "3D000":
			return "check the database name"
		case "53300":
			return "the server has no connection slots left: retry later or raise max_connections"
		case "57P03":
			return "the server is starting up, recovering from a crash or shutting down: wait until it accepts connections (pg_isready), then run the command again"
		}
		if param, ok := strings.CutPrefix(pgErr.Message, "unsupported startup parameter: "); ok {
			return startupParamHint(param)
		}
	}
	return "check the host, port, user, password and database, and that the server accepts connections from here"
}

// startupParamHint: a connection pooler (PgBouncer says "unsupported
// startup parameter: <name>") refused a setting the connection sends when
// it starts. For options, that is the DSN's options= (or PGOPTIONS): such a
// pooler passes no options to the server at all, so the settings have to
// reach the session another way.
func startupParamHint(param string) string {
	if param == "options" {
		return "the server is a connection pooler (PgBouncer) that refuses the startup parameter options, which the DSN's options= (or PGOPTIONS) sends; " +
			"remove options from the DSN and PGOPTIONS, and set what it set on the role instead (ALTER ROLE ... SET name = value), " +
			"or connect to PostgreSQL directly instead of through the pooler; adding options to the pooler's ignore_startup_parameters " +
			"lets the connection through but drops those settings without a word"
	}
	return fmt.Sprintf("the server is a connection pooler (PgBouncer) that refuses the startup parameter %s: remove it from the DSN "+
		"(or its PG* variable), or connect to PostgreSQL directly instead of through the pooler", param)
}

// jsonOutput says whether --format json was chosen.
func jsonOutput(c *ucli.Context) bool { return c.String("format") == "json" }
