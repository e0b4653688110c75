package session

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The fuzz targets below build connection strings around a known password
// in every spelling a user can type (URL userinfo, URL query parameter,
// key/value quoted and bare) with the other parts fuzzed, so that many of
// them are malformed. Whatever the input, neither Redact, nor the error of
// ParseConfig, nor RedactText over an error that quotes the input may still
// hold the password.
//
// `make test` runs the seed corpus (f.Add below and testdata/fuzz/...) as
// ordinary tests; `make fuzz` explores for $(FUZZTIME) per target.

// dsnForms are the spellings of a connection string with a password.
const (
	formURLUserinfo = iota
	formURLQuery
	formKVQuoted
	formKVBare
	formURLRaw // userinfo typed by hand, not percent-encoded
	numForms
)

// buildDSN returns the connection string of form with password pw, and the
// spellings of pw that appear in it.
func buildDSN(form uint8, user, pw, host, rest string) (string, []string) {
	switch form % numForms {
	case formURLUserinfo:
		u := &url.URL{Scheme: "postgres", User: url.UserPassword(user, pw), Host: host, Path: "/db"}
		enc := strings.TrimPrefix(url.UserPassword("", pw).String(), ":")
		return u.String() + "?" + rest, []string{pw, enc}
	case formURLQuery:
		q := url.Values{"password": {pw}}
		return "postgres://" + url.User(user).String() + "@" + host + "/db?" + q.Encode() + "&" + rest, []string{pw, url.QueryEscape(pw)}
	case formKVQuoted:
		esc := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
		return "host=" + host + " user=" + user + " password='" + esc + "' " + rest, []string{pw, esc}
	case formKVBare:
		return "host=" + host + " user=" + user + " password=" + pw + " " + rest, []string{pw}
	default:
		return "postgres://" + user + ":" + pw + "@" + host + "/db?" + rest, []string{pw}
	}
}

// secret says whether s is a spelling worth checking: long enough not to
// occur by chance, and absent from the string built without it (a password
// "host" is legitimately present in "host=...").
// Messages quote the input with %q, so its escaped form counts too.
func secret(s, withoutPassword string) bool {
	return len(s) >= 4 && !strings.Contains(withoutPassword, s) && !strings.Contains(strconv.Quote(withoutPassword), s)
}

// checkNoPassword fails when text holds a spelling of the password.
func checkNoPassword(t *testing.T, what, text, input string, spellings []string, withoutPassword string) {
	t.Helper()
	for _, s := range spellings {
		if secret(s, withoutPassword) && strings.Contains(text, s) {
			t.Fatalf("%s leaks the password spelling %q\ninput: %q\noutput: %q", what, s, input, text)
		}
	}
}

func FuzzRedact(f *testing.F) {
	for form := uint8(0); form < numForms; form++ {
		f.Add(form, "alice", "s3cr3t-pass", "db.example:5432", "sslmode=disable")
		f.Add(form, "alice", "p@ss:w/rd?#", "db.example:notaport", "")
		f.Add(form, "bob", `it's a \ quote`, "[::1", "x=y")
		f.Add(form, "bob", "pass word with spaces", "h1:5432,h2:5433", "target_session_attrs=any")
		f.Add(form, "", "%41%42%43%44", "db", "connect_timeout=abc")
		f.Add(form, "u", "ünïcødé-πass", "db", "default_query_exec_mode=nope")
	}
	f.Fuzz(func(t *testing.T, form uint8, user, pw, host, rest string) {
		if !utf8.ValidString(pw) || strings.ContainsAny(pw, "\x00") {
			t.Skip("passwords are text")
		}
		input, spellings := buildDSN(form, user, pw, host, rest)
		// The same string with a password no test value can contain.
		without, _ := buildDSN(form, user, "\x00", host, rest)
		if form%numForms == formKVBare && strings.ContainsAny(pw, " \t\n\r\v\f'\\") {
			// A bare key/value value ends at white space: the rest is no longer the password.
			t.Skip("not a bare password")
		}
		if form%numForms == formURLRaw && (strings.ContainsAny(pw, "/?#@ \t\n") || strings.ContainsAny(user, ":/?#@")) {
			// Typed by hand, these characters end the userinfo (or are the
			// last '@'): what remains is not the password the user meant.
			t.Skip("not a raw URL password")
		}

		checkNoPassword(t, "Redact", Redact(input), input, spellings, without)

		cfg, err := ParseConfig(input)
		if err != nil {
			checkNoPassword(t, "ParseConfig error", err.Error(), input, spellings, without)
		} else if cfg.Password != "" && secret(cfg.Password, without) {
			// What pgx parsed is a password too: Redact and RedactText must hide it.
			checkNoPassword(t, "Redact (parsed password)", Redact(input), input, []string{cfg.Password}, without)
		}
		// An error of a lower layer that quotes the input verbatim, and, when
		// pgx could parse it, the password it parsed.
		quoted := "cannot connect using `" + input + "`"
		if err == nil {
			quoted += ": password " + cfg.Password + " rejected"
		}
		checkNoPassword(t, "RedactText", RedactText(quoted, input), input, spellings, without)
	})
}

// FuzzParseConfigArbitrary feeds arbitrary text: nothing may panic, and when
// pgx finds a password in it, neither the error, nor Redact may show it.
func FuzzParseConfigArbitrary(f *testing.F) {
	for _, s := range []string{
		"postgres://alice:s3cr3t@host:5432/db",
		"postgres://alice:s3cr3t@host:notaport/db",
		"postgresql://alice:s3cr3t@[bad",
		"host=db user=alice password=s3cr3t dbname=app",
		"host=db user=alice password='s3 cr3t' port=x",
		"password=s3cr3t sslmode=bogus",
		"postgres://alice@host/db?password=s3cr3t&sslmode=maybe",
		"postgres://:s3cr3t@/db",
		"",
		"=",
		"postgres://%zz:s3cr3t@host/db",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		red := Redact(input)
		cfg, err := ParseConfig(input)
		if err != nil {
			return // the error is checked against known passwords in FuzzRedact
		}
		pw := cfg.Password
		if pw == "" || len(pw) < 4 || strings.Count(input, pw) != 1 {
			return // too short to tell apart, or also part of another field
		}
		// Present once in the input, and pgx took it as the password.
		if strings.Contains(red, pw) {
			t.Fatalf("Redact(%q) = %q still holds the password %q", input, red, pw)
		}
		if got := RedactText("error near "+input, input); strings.Contains(got, pw) {
			t.Fatalf("RedactText over %q = %q still holds the password %q", input, got, pw)
		}
	})
}

// formerLeaks are inputs the fuzzers found where Redact (and so the error of
// ParseConfig, which quotes Redact's result) used to show the password: raw
// URL passwords that net/url rejects but pgx's own URL parser accepts or
// splits differently. Redact now starts from pgx's own redaction.
var formerLeaks = []struct{ dsn, password string }{
	{"postgres://u:my pass@host/db", "my pass"}, // a space typed in the password
	{"postgres://u:p@ss@host:x/db", "p@ss"},     // an '@' typed in the password, bad port
	{"postgres://0:000\r@0/db?0", "000\r"},      // a control character
	{"postgres:// :000000@00", "000000"},        // a space in the user name
	{"postgres://#:0000@", "0000"},              // pgx takes '#' as part of the user
	{"host=h password= s3cr3t", "s3cr3t"},       // a blank after "password=" (pgx's redaction drops it)
}

func TestRedactFormerLeaks(t *testing.T) {
	for _, c := range formerLeaks {
		if got := Redact(c.dsn); strings.Contains(got, c.password) {
			t.Errorf("Redact(%q) = %q shows the password", c.dsn, got)
		}
		if _, err := ParseConfig(c.dsn); err != nil && strings.Contains(err.Error(), c.password) {
			t.Errorf("ParseConfig(%q) error %q shows the password", c.dsn, err)
		}
		if got := RedactText("failed: "+c.dsn, c.dsn); strings.Contains(got, c.password) {
			t.Errorf("RedactText over %q = %q shows the password", c.dsn, got)
		}
	}
}

// vocabulary is every fixed text a malformed-string error is built from:
// the only text such an error may share with the input.
func vocabulary() string {
	parts := []string{ErrMalformed.Error(), notShown, fixMalformed, problemScheme, problemParamValue, problemURL, problemOther}
	for _, p := range malformedPhrases {
		parts = append(parts, p.problem)
	}
	parts = append(parts, knownParams...)
	return strings.Join(parts, "\n")
}

// leakedFragment returns a 4-character piece of token found in text and in
// no fixed phrase, or "".
func leakedFragment(text, token, vocab string) string {
	r := []rune(token)
	for i := 0; i+4 <= len(r); i++ {
		g := string(r[i : i+4])
		if strings.Contains(text, g) && !strings.Contains(vocab, g) {
			return g
		}
	}
	return ""
}

// FuzzMalformedMessage: a connection string that does not parse is never
// echoed, whole or in part. Whatever the form and the fuzzed parts around a
// password, no 4-character piece of the password (nor of the user, host or
// options, which a password typed raw can spill into) is in the error,
// except where the piece is part of the message's own fixed wording.
func FuzzMalformedMessage(f *testing.F) {
	for form := uint8(0); form < numForms; form++ {
		f.Add(form, "alice", "s3cr3t-pass", "db.example:notaport", "sslmode=disable")
		f.Add(form, "alice", "p@ss:w/rd?#", "db.example:5432", "")
		f.Add(form, "bob", "50%off-secret", "db", "x=y")
		f.Add(form, "bob", "pass word with spaces", "[::1", "target_session_attrs=any")
		f.Add(form, "u", "ünïcødé-πass", "db", "connect_timeout=abc")
		f.Add(form, "u", "zq'x\\secret", "db", "default_query_exec_mode=nope")
		f.Add(form, "u", "%zzsecret", "db:1:2", "sslmode=bogus")
	}
	vocab := vocabulary()
	f.Fuzz(func(t *testing.T, form uint8, user, pw, host, rest string) {
		input, _ := buildDSN(form, user, pw, host, rest)
		_, err := ParseConfig(input)
		if err == nil {
			return
		}
		msg := err.Error()
		if !strings.Contains(msg, "PGPASSWORD") || !strings.HasPrefix(msg, ErrMalformed.Error()) {
			t.Fatalf("message lacks the fix: %q", msg)
		}
		for _, token := range []string{pw, user, host, rest} {
			if g := leakedFragment(msg, token, vocab); g != "" {
				t.Fatalf("error shows %q of %q\ninput: %q\nerror: %q", g, token, input, msg)
			}
		}
	})
}

// TestMalformedNamesTheComponent: each kind of mistake gets its component.
func TestMalformedNamesTheComponent(t *testing.T) {
	cases := map[string]string{
		"postgres://alice:s3cr3t@db:notaport/app":       "port",
		"postgres://a:p@ss:w/rd@h/db":                   "port",
		"postgres://a:50%off@h/db":                      "user info",
		"postgres://a:my pass@h/db":                     "user info",
		"postgres://a%zz:pw@h/db":                       "percent-escape",
		"mysql://a:secret@h/db":                         "scheme",
		"host=h password='abc":                          "quoting",
		"host=h user":                                   "parameter",
		"postgres://h/db?x":                             "parameter",
		"postgres://h/db?sslmode=bogus":                 "parameter sslmode",
		"postgres://h/db?connect_timeout=abc":           "parameter connect_timeout",
		"postgres://h/db?default_query_exec_mode=nope":  "parameter default_query_exec_mode",
		"postgres://[::1/db":                            "host",
		"postgres://a:pw@h/db?target_session_attrs=bad": "parameter target_session_attrs",
	}
	for in, want := range cases {
		_, err := ParseConfig(in)
		if err == nil {
			t.Errorf("%q parsed", in)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, ": "+want) || !strings.Contains(msg, "percent-encode") || !strings.Contains(msg, "PGPASSWORD") {
			t.Errorf("%q: %q does not name %q and the fix", in, msg, want)
		}
	}
}
