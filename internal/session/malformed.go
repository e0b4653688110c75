package session

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Messages for a connection string that does not parse. They are built only
// from the fixed phrases below, never from the input: a string that does not
// parse cannot be split reliably, so any part of it may be a piece of the
// password (an '@', ':' or '/' typed in a password moves the boundaries).
// pgx's error is read only to pick the phrase.

// fixMalformed is what to do, in every message.
const fixMalformed = "percent-encode the special characters of the password (@ as %40, : as %3A, / as %2F, # as %23, ? as %3F, % as %25, a space as %20), " +
	"or leave the password out of the string and pass it in PGPASSWORD or ~/.pgpass"

// The messages not in malformedPhrases.
const (
	problemScheme     = "scheme: a URL must start with postgres:// or postgresql://"
	problemParamValue = ": its value is not one it accepts"
	problemURL        = "the URL does not parse"
	problemOther      = "neither a postgres:// URL nor keyword=value pairs"
	notShown          = "(not shown, as it may hold a password)"
)

// knownParams are connection parameters pgx names in its errors; a message
// names one only if pgx's own phrase (not the input) holds it.
var knownParams = []string{
	"connect_timeout", "sslmode", "sslcertmode", "sslrootcert", "sslcert", "sslkey", "sslpassword",
	"target_session_attrs", "min_protocol_version", "max_protocol_version", "channel_binding",
	"require_auth", "statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
}

// malformedPhrases maps a phrase of pgx's error (its own wording, the input
// removed) to the component at fault and what is wrong with it. First match
// wins.
var malformedPhrases = []struct{ phrase, problem string }{
	{"nul byte", "the string holds a NUL byte"},
	{"percent-encoded token in password", "user info: the password holds a '%' not followed by two hex digits"},
	{"%00 in percent-encoded value in password", "user info: the password holds %00"},
	{"spaces found in password", "user info: the password holds a space"},
	{"percent-encoded token", "percent-escape: a '%' not followed by two hex digits (a literal % is written %25)"},
	{"%00", "percent-escape: %00 is not allowed"},
	{"unexpected spaces", "a space inside the URL (written %20 in a URL)"},
	{"ipv6", "host: an IPv6 address needs [brackets] around it"},
	{"unexpected character", "host: the host must end at ':' (port), '/' (database) or '?' (parameters)"},
	{"invalid uri", "scheme: not a postgres:// or postgresql:// URL"},
	{"query parameter", "parameter: each URL parameter must be key=value, joined by '&'"},
	{"port", "port: invalid port (each must be a number from 1 to 65535, one per host)"},
	{"unterminated quoted string", "quoting: a quoted value is not closed (a quote inside one is written \\')"},
	{`missing "="`, "parameter: each part must be keyword=value, separated by spaces (a value with spaces needs 'quotes')"},
	{"invalid keyword/value", "parameter: each part must be keyword=value, separated by spaces (a value with spaces needs 'quotes')"},
	{"service", "parameter service: the service file or the service in it cannot be read"},
	{"sslmode is invalid", "parameter sslmode: must be disable, allow, prefer, require, verify-ca or verify-full"},
	{"tls", "parameter sslmode/sslrootcert/sslcert/sslkey: a TLS setting is invalid or its file cannot be read"},
}

// describeMalformed names the component of dsn at fault for pgx's parse
// error err, without a byte of dsn.
func describeMalformed(dsn string, err error) string {
	if scheme, _, ok := strings.Cut(dsn, "://"); ok && !strings.ContainsAny(scheme, "= '") &&
		!strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return problemScheme
	}
	what := pgxPhrase(dsn, err)
	for _, p := range malformedPhrases {
		if strings.Contains(what, p.phrase) {
			return p.problem
		}
	}
	// Named parameters: pgx's phrase is "invalid <name>", "unknown <name>
	// value: ...", "cannot parse <name>".
	head, _, _ := strings.Cut(what, ":")
	for _, k := range knownParams {
		if strings.Contains(head, k) {
			return "parameter " + k + problemParamValue
		}
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return problemURL
	}
	return problemOther
}

// pgxPhrase is pgx's error without the (redacted) input it quotes, lower
// case. The nested error can still quote raw parts (a user name, a query
// key): it is only searched for the phrases above, never printed.
func pgxPhrase(dsn string, err error) string {
	msg := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		prefix := pgconn.NewParseConfigError(pce.ConnString, "", nil).Error() // "cannot parse `...`: "
		msg = strings.TrimPrefix(msg, prefix)
	} else {
		msg = strings.ReplaceAll(msg, dsn, "")
	}
	return strings.ToLower(msg)
}
