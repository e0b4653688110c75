package upgrade

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
)

// Before the table locks: the statements of upstream's hops that take no
// lock the application waits for. Creating, replacing, dropping or
// commenting a function takes no lock on a table the application reads or
// writes (a SQL body's validation takes ACCESS SHARE or ROW EXCLUSIVE on
// the tables it names, which no application statement conflicts with,
// and calling a function takes no lock on it); nor do the rows of the
// Supabase ledger and of this tool's own record (the step after this one). They run in the same transaction as the rest, so they
// commit or roll back with it, but before its first LOCK TABLE: the time
// they take is no longer time the application is locked out.
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
//     later files replace again).
// The end catalog is the same: the same statements, each function's own
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

// runEarly runs, in plan order, the statements of the upstream hops before
// this tool's own that may run before the table locks, and writes the
// ledger row of every upstream hop.
func (a *applyRun) runEarly() error {
	a.early = &early{stmts: map[int]map[int]bool{}, ledger: map[int]bool{}}
	moving := true               // before this tool's own hop
	held := false                // a statement kept for the locks may call functions: all later ones keep their place
	var kept []string            // the statements kept for the locks so far
	blocked := map[string]bool{} // functions one of whose statements stays in place
	for _, h := range a.plan.Hops {
		if h.Kind != HopUpstream {
			moving = false
			continue
		}
		sql, err := a.copy.Read(h.Upstream.Index)
		if err != nil {
			return a.fail(outcome.Refused, err)
		}
		stmts, err := pgflowfiles.Statements(sql)
		if err != nil {
			return fmt.Errorf("%s: %w", h.Path, err)
		}
		for i, st := range stmts {
			if !moving {
				break
			}
			body := leadingComments.ReplaceAllString(st, "")
			m := functionStmt.FindStringSubmatch(body)
			if m == nil || held || isTxControl(st) {
				kept = append(kept, body)
				held = held || !tableDDL.MatchString(body) || qualifiedCall.MatchString(body)
				continue
			}
			fn := strings.ToLower(m[1] + "." + m[2])
			if blocked[fn] || namedIn(kept, m[2]) {
				blocked[fn] = true
				kept = append(kept, body)
				continue
			}
			ok, err := a.tryEarly(h, i, st)
			if err != nil {
				return err
			}
			if !ok {
				blocked[fn] = true
				kept = append(kept, body)
				continue
			}
			if a.early.stmts[h.Upstream.Index] == nil {
				a.early.stmts[h.Upstream.Index] = map[int]bool{}
			}
			a.early.stmts[h.Upstream.Index][i] = true
		}
		if err := a.recordHop(h, sql); err != nil {
			return err
		}
		a.early.ledger[h.Upstream.Index] = true
	}
	return nil
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
