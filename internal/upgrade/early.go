package upgrade

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Before the table locks: the statements of upstream's hops that take no
// lock the application waits for. Creating, replacing, dropping or
// commenting a function takes no lock on a table the application reads or
// writes (a SQL body's validation takes ACCESS SHARE or ROW EXCLUSIVE on
// the tables it names, which no application statement conflicts with,
// and calling a function takes no lock on it); nor do the rows of the
// Supabase ledger and of this tool's own record (the step after this
// one). They run in the same transaction as the rest, so they commit or
// roll back with it, but before its first LOCK TABLE: the time they take
// is no longer time the application is locked out.
//
// Moving a statement ahead of the ones before it must not change what
// either does. So a function statement runs early only when
//   - every statement before it that stays for the locks is a table's
//     ALTER or COMMENT that calls no schema-qualified function and does not
//     name it (what such a statement does cannot depend on a function's
//     body; anything else — an UPDATE, a SELECT, a DO block — may call
//     one, and keeps every later statement in its place);
//   - it succeeds there: a SQL body that names a column an earlier
//     statement adds fails its validation, and a comment on a function not
//     yet created fails; it is then rolled back to its savepoint and stays
//     in its place, with every later statement on the same function;
//   - its hop comes before this tool's own (which replaces functions that
//     later files replace again, and may call anything).
// A statement that makes or fills something in a schema the plan itself
// creates (0.17.1's pgflow_telemetry: its functions, tables, comments and
// the row of its cron job) runs early wherever it is, when no statement
// kept before it names that schema: what the kept ones do cannot depend
// on objects they do not name, and a function body that names a column a
// kept statement adds fails its validation and stays, as above. A table
// with a foreign key is not made early (it locks the table it references),
// nor a row inserted from pgflow's tables.
// The end catalog is the same: the same statements, each object's own
// statements in their order.

// StepHopsEarly is the step that runs them.
const StepHopsEarly = "hops_before_locks"

var (
	// CREATE [OR REPLACE] FUNCTION, DROP FUNCTION [IF EXISTS], COMMENT ON
	// FUNCTION, then the function's schema-qualified name.
	functionStmt = regexp.MustCompile(`(?is)^(?:CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION|DROP\s+FUNCTION(?:\s+IF\s+EXISTS)?|COMMENT\s+ON\s+FUNCTION)\s+"?([a-z_][a-z0-9_]*)"?\s*\.\s*"?([a-z_][a-z0-9_]*)"?\s*\(`)
	// A table's ALTER or COMMENT.
	tableDDL = regexp.MustCompile(`(?is)^(?:ALTER\s+TABLE|COMMENT\s+ON\s+(?:TABLE|COLUMN|CONSTRAINT))\s`)
	// A schema-qualified call: schema.name( with optional quotes.
	qualifiedCall = regexp.MustCompile(`(?i)[a-z_][a-z0-9_]*"?\s*\.\s*"?[a-z_][a-z0-9_]*"?\s*\(`)
	// CREATE SCHEMA "name".
	createSchema = regexp.MustCompile(`(?is)^CREATE\s+SCHEMA\s+"?([a-z_][a-z0-9_]*)"?\s*(?:;|$)`)
	// What makes or fills one object, then its schema.
	freshTarget = regexp.MustCompile(`(?is)^(?:CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION|CREATE\s+TABLE|COMMENT\s+ON\s+(?:TABLE|COLUMN|FUNCTION)|INSERT\s+INTO)\s+"?([a-z_][a-z0-9_]*)"?\s*\.`)
	foreignKey  = regexp.MustCompile(`(?i)\bREFERENCES\b`)
	pgflowName  = regexp.MustCompile(`(?i)\bpgflow"?\s*\.`)
	// Leading comments and blank lines of a statement.
	leadingComments = regexp.MustCompile(`^(?:\s+|--[^\n]*\n?)*`)
)

// early is what ran before the table locks: by upstream file index, the
// statements (0-based), and the files whose ledger row is written.
type early struct {
	stmts  map[int]map[int]bool
	ledger map[int]bool
}

func (e *early) ran(file, stmt int) bool { return e != nil && e.stmts[file][stmt] }

func (e *early) recorded(file int) bool { return e != nil && e.ledger[file] }

// hasEarlyHops: the plan runs upstream's files.
func hasEarlyHops(a *applyRun) bool {
	return !a.pgmqOnly && a.plan != nil && a.plan.Has(HopUpstream) && a.copy != nil && a.copyErr == nil
}

// runEarly runs, in plan order, the statements of upstream's hops that
// may run before the table locks, and writes the ledger row of every
// upstream hop.
func (a *applyRun) runEarly() error {
	a.early = &early{stmts: map[int]map[int]bool{}, ledger: map[int]bool{}}
	held := false                // a statement kept for the locks may call functions: later function statements keep their place
	var kept []string            // the statements kept for the locks so far
	var keptOutside []string     // those of them outside the schemas the plan creates
	blocked := map[string]bool{} // functions one of whose statements stays in place
	fresh := map[string]bool{}   // schemas the plan creates, created here
	for _, h := range a.plan.Hops {
		if h.Kind != HopUpstream {
			// This tool's own hop runs under the locks: its statements are
			// kept, and may call anything.
			for _, m := range a.all {
				if slices.Contains(a.r.Pending, m.Version+"_"+m.Name) {
					kept, keptOutside = append(kept, m.SQL), append(keptOutside, m.SQL)
				}
			}
			held = true
			continue
		}
		file, err := a.upstreamText(h)
		if err != nil {
			return err
		}
		for i, st := range file.stmts {
			body := leadingComments.ReplaceAllString(st, "")
			var fn, schema string
			try := false
			f := functionStmt.FindStringSubmatch(body)
			if f != nil {
				fn = strings.ToLower(f[1] + "." + f[2])
			}
			m := freshStmt(body)
			switch {
			case isTxControl(st):
			case m != nil && (fresh[strings.ToLower(m[1])] || createSchema.MatchString(body)) && !namedIn(keptOutside, m[1]):
				// In a schema the plan creates: nothing kept before it
				// outside that schema names what it makes (one kept inside
				// it came first in upstream's order, so it cannot use it).
				schema, try = strings.ToLower(m[1]), true
			case f != nil:
				try = !held && !namedIn(kept, f[2])
			}
			inFresh := m != nil && fresh[strings.ToLower(m[1])]
			if !try || blocked[fn] {
				if fn != "" {
					blocked[fn] = true // its later statements stay after this one
				}
				kept = append(kept, body)
				if !inFresh {
					keptOutside = append(keptOutside, body)
				}
				// A function statement calls nothing; another kept statement
				// may, unless it is a table's ALTER or COMMENT without a call.
				held = held || (f == nil && (!tableDDL.MatchString(body) || qualifiedCall.MatchString(body)))
				continue
			}
			ok, err := a.tryEarly(h, i, st)
			if err != nil {
				return err
			}
			if !ok {
				if fn != "" {
					blocked[fn] = true
				}
				kept = append(kept, body)
				if !inFresh {
					keptOutside = append(keptOutside, body)
				}
				held = held || f == nil // a row or a table that could not be made here: later ones keep their place
				continue
			}
			if createSchema.MatchString(body) {
				fresh[schema] = true
			}
			if a.early.stmts[h.Upstream.Index] == nil {
				a.early.stmts[h.Upstream.Index] = map[int]bool{}
			}
			a.early.stmts[h.Upstream.Index][i] = true
		}
		if err := a.recordHop(h, file.sql); err != nil {
			return err
		}
		a.early.ledger[h.Upstream.Index] = true
	}
	return nil
}

// freshStmt matches a statement that makes or fills something in one
// schema only: CREATE SCHEMA, CREATE [OR REPLACE] FUNCTION, CREATE TABLE
// (without a foreign key: it would lock the table it references), COMMENT
// ON a table, column or function, INSERT INTO (reading no pgflow table).
// m[1] is the schema.
func freshStmt(body string) []string {
	if m := createSchema.FindStringSubmatch(body); m != nil {
		return m
	}
	m := freshTarget.FindStringSubmatch(body)
	switch {
	case m == nil:
		return nil
	case strings.HasPrefix(strings.ToUpper(m[0]), "CREATE TABLE") && foreignKey.MatchString(body):
		return nil
	case strings.HasPrefix(strings.ToUpper(m[0]), "INSERT") && pgflowName.MatchString(body):
		return nil
	}
	return m
}

// tryEarly runs one statement under a savepoint: false (rolled back) when
// the database refuses it here.
func (a *applyRun) tryEarly(h Hop, i int, st string) (bool, error) {
	if _, err := a.tx.Exec(a.ctx, "savepoint pgflow_upgrade_early"); err != nil {
		return false, fmt.Errorf("savepoint before %s statement %d: %w", h.File, i+1, err)
	}
	t := time.Now()
	tag, err := a.tx.Exec(a.ctx, st)
	took := time.Since(t)
	if err != nil {
		if a.ctx.Err() != nil {
			return false, fmt.Errorf("upstream's %s statement %d (%s): %w", h.File, i+1, summary(st), err)
		}
		if _, rbErr := a.tx.Exec(a.ctx, "rollback to savepoint pgflow_upgrade_early"); rbErr != nil {
			return false, fmt.Errorf("rollback to savepoint after %s statement %d: %w", h.File, i+1, rbErr)
		}
		return false, nil
	}
	if _, err := a.tx.Exec(a.ctx, "release savepoint pgflow_upgrade_early"); err != nil {
		return false, fmt.Errorf("release savepoint after %s statement %d: %w", h.File, i+1, err)
	}
	a.r.Statements = append(a.r.Statements, StatementReport{Migration: h.Upstream.Version(), Index: i + 1, Summary: "before the table locks: " + summary(st),
		DurationMS: took.Milliseconds(), DurationUS: took.Microseconds(), Rows: tag.RowsAffected()})
	return true, nil
}

// namedIn: name appears as a word in one of stmts.
func namedIn(stmts []string, name string) bool {
	re := regexp.MustCompile(`(?i)\b` + regexp.QuoteMeta(name) + `\b`)
	for _, s := range stmts {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
