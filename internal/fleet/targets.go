package fleet

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Target is one database of the fleet: a line of the targets file.
type Target struct {
	Name string // as written, or host/database for a bare DSN
	DSN  string // never printed: Database is what messages show
	Line int    // its line in the file: the report's order
	// Database names it without a password: user@host:port/database.
	Database string
	// HasPassword: the DSN itself carries a password (not PGPASSWORD or
	// a password file).
	HasPassword bool
}

// ErrTargets marks a targets file that cannot be used (a usage error).
var ErrTargets = errors.New("targets file")

// namePattern is what a target name may be: it goes into file names,
// JUnit test cases and Markdown tables unescaped.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]*$`)

// maxLine bounds one line of the file (a DSN with every parameter fits).
const maxLine = 64 * 1024

// ParseTargets reads a targets file: one target a line, "NAME DSN" or a
// bare DSN (then named host/database), blank lines and lines starting
// with # ignored. A line that cannot be used is refused with its number
// and the reason, never with its text (it may hold a password); so is a
// name used twice. where names the file in messages.
func ParseTargets(r io.Reader, where string) ([]Target, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	var out []Target
	seen := map[string]int{}
	n := 0
	for sc.Scan() {
		n++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		t, err := parseLine(text)
		if err != nil {
			return nil, fmt.Errorf("%w %s, line %d: %s", ErrTargets, where, n, err)
		}
		if first, dup := seen[t.Name]; dup {
			return nil, fmt.Errorf("%w %s, line %d: target name %q is already used on line %d; names must be unique (write \"NAME DSN\")", ErrTargets, where, n, t.Name, first)
		}
		seen[t.Name] = n
		t.Line = n
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w %s, line %d: longer than %d bytes", ErrTargets, where, n+1, maxLine)
		}
		return nil, fmt.Errorf("%w %s: reading: %v", ErrTargets, where, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w %s: no targets (one a line: NAME DSN, or a bare DSN; # starts a comment)", ErrTargets, where)
	}
	return out, nil
}

// parseLine reads "NAME DSN" or a bare DSN. A key=value DSN has spaces of
// its own: the first word is a name only when it has no '=' and is not a
// URL, and something follows it.
func parseLine(text string) (Target, error) {
	name, dsn := "", text
	if i := strings.IndexAny(text, " \t"); i > 0 {
		if first := text[:i]; !strings.Contains(first, "=") && !isURL(first) {
			name, dsn = first, strings.TrimSpace(text[i:])
		}
	}
	if name != "" && !namePattern.MatchString(name) {
		return Target{}, fmt.Errorf("target name is not usable (letters, digits and . _ : / @ - only, starting with a letter or digit)")
	}
	if dsn == "" {
		return Target{}, fmt.Errorf("no connection string after the name")
	}
	if !isURL(dsn) && !strings.Contains(dsn, "=") {
		return Target{}, fmt.Errorf("not a connection string (a postgres:// URL or key=value pairs); a name needs a connection string after it")
	}
	cfg, err := session.ParseConfig(dsn) // never echoes the string
	if err != nil {
		return Target{}, err
	}
	t := Target{Name: name, DSN: dsn, Database: session.Describe(cfg), HasPassword: session.Redact(dsn) != dsn}
	if t.Name == "" {
		t.Name = cfg.Host + "/" + cfg.Database
		if !namePattern.MatchString(t.Name) {
			return Target{}, fmt.Errorf("its host/database cannot name it: write \"NAME DSN\"")
		}
	}
	return t, nil
}

func isURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// ExposedPasswords is the warning for a targets file that holds passwords
// and that its group or others may read (mode & 0o077), or "" when there is
// nothing to warn about.
func ExposedPasswords(targets []Target, mode fs.FileMode, where string) string {
	n := 0
	for _, t := range targets {
		if t.HasPassword {
			n++
		}
	}
	if n == 0 || mode.Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("warning: %s holds %d password(s) and is readable by its group or others (mode %04o): chmod 600 it, or keep the passwords in ~/.pgpass (PGPASSFILE) and leave them out of the DSNs",
		where, n, mode.Perm())
}
