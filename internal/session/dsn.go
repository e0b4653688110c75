// Resolution of the connection string and redaction of its password.
//
// Resolution order: the --dsn flag, then PGFLOW_UPGRADE_DSN, then
// DATABASE_URL, then libpq's PG* variables as pgx reads them (an empty
// connection string makes pgx consult PGHOST, PGUSER, PGPASSWORD, ...).

package session

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Source says where a connection string came from, for messages.
type Source string

const (
	SourceFlag        Source = "--dsn"
	SourceToolEnv     Source = "PGFLOW_UPGRADE_DSN"
	SourceDatabaseURL Source = "DATABASE_URL"
	SourceLibpqEnv    Source = "PG* environment"
	SourceNone        Source = "none"
)

// Resolved is a connection string and where it came from.
type Resolved struct {
	DSN    string
	Source Source
}

// libpqVars are the variables whose presence means the user configured a
// connection through libpq's environment.
var libpqVars = []string{"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE"}

// Resolve picks the connection string from the flag value and the
// environment. Source is SourceNone when nothing at all was configured: the
// caller decides whether that means "use an ephemeral local server" or "error".
func Resolve(flagValue string, getenv func(string) string) Resolved {
	if flagValue != "" {
		return Resolved{DSN: flagValue, Source: SourceFlag}
	}
	if v := getenv("PGFLOW_UPGRADE_DSN"); v != "" {
		return Resolved{DSN: v, Source: SourceToolEnv}
	}
	if v := getenv("DATABASE_URL"); v != "" {
		return Resolved{DSN: v, Source: SourceDatabaseURL}
	}
	for _, name := range libpqVars {
		if getenv(name) != "" {
			return Resolved{DSN: "", Source: SourceLibpqEnv}
		}
	}
	return Resolved{Source: SourceNone}
}

// ErrMalformed marks a connection string pgx cannot parse.
var ErrMalformed = errors.New("malformed connection string")

// ParseConfig parses a connection string into a pgx config. A string that
// does not parse is never quoted, whole or in part: the error names the
// component at fault and the fix (malformed.go).
func ParseConfig(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %s; %s", ErrMalformed, notShown, describeMalformed(dsn, err), fixMalformed)
	}
	return cfg, nil
}

// keyValuePassword matches password=... in a key/value connection string,
// quoted or not.
var keyValuePassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlUserinfo matches the userinfo part of a postgres:// URL.
var urlUserinfo = regexp.MustCompile(`(?i)(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)(@)`)

// Redact returns the connection string with any password replaced by "xxxxx".
// It works on URLs and on key/value strings, and on malformed input too: it
// starts from pgx's own redaction, which splits a URL exactly as pgx's parser
// does (a space or an '@' typed in a password included), then masks what
// net/url and the patterns below recognise on top.
func Redact(dsn string) string {
	in := dsn
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		// Key/value: mask first, as typed. pgx's redaction drops the blank
		// after "password=" and so leaves "password= secret" unmasked.
		in = keyValuePassword.ReplaceAllString(dsn, "${1}xxxxx")
	}
	out := pgxRedact(in)
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			out = u.String()
		}
		q := u.Query()
		if q.Has("password") {
			q.Set("password", "xxxxx")
			u.RawQuery = q.Encode()
			out = u.String()
		}
	}
	out = urlUserinfo.ReplaceAllString(out, "${1}xxxxx${3}")
	out = keyValuePassword.ReplaceAllString(out, "${1}xxxxx")
	return out
}

// pgxRedact returns pgx's redaction of dsn: the text between the backquotes
// of its parse-error message ("cannot parse `...`: ").
func pgxRedact(dsn string) string {
	msg := pgconn.NewParseConfigError(dsn, "", nil).Error()
	start, end := strings.Index(msg, "`"), strings.LastIndex(msg, "`")
	if start < 0 || end <= start {
		return dsn
	}
	return msg[start+1 : end]
}

// RedactText removes every password that appears in dsn from an arbitrary
// text (an error message, a log line): the whole connection string first,
// then each spelling of its password.
func RedactText(text, dsn string) string {
	if dsn != "" {
		text = strings.ReplaceAll(text, dsn, Redact(dsn))
	}
	for _, pw := range passwords(dsn) {
		if pw != "" && len(pw) >= 1 {
			text = strings.ReplaceAll(text, pw, "xxxxx")
		}
	}
	return text
}

// passwords lists the password spellings present in dsn: raw, URL-decoded,
// and as pgx parsed it (which also covers PGPASSWORD).
func passwords(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		if pw := u.Query().Get("password"); pw != "" {
			out = append(out, pw)
		}
	}
	if m := urlUserinfo.FindStringSubmatch(dsn); m != nil {
		out = append(out, m[2])
	}
	for _, m := range keyValuePassword.FindAllStringSubmatch(dsn, -1) {
		out = append(out, strings.Trim(m[2], "'"), m[2])
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil && cfg.Password != "" {
		out = append(out, cfg.Password)
	}
	return out
}

// Describe names the target for messages: user@host:port/db, no password.
func Describe(cfg *pgx.ConnConfig) string {
	if cfg == nil {
		return "(unknown)"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}
