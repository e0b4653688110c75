package upgrade

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
	"github.com/pgflow-upgrade/pgflow-upgrade/preflight"
)

// DeferredChecks are preflight checks apply does not run up front, because
// the migration itself finds the same thing at no extra cost: two tasks of
// one flow sharing a message id make the unique (queue_name, message_id)
// build fail, and a GROUP BY over millions of rows first would cost as much
// as the build, under the ACCESS EXCLUSIVE lock. When the migration fails
// that way, apply runs the check then, to print its findings.
var DeferredChecks = map[string]string{"tasks.duplicate_message_id": "23505"}

// preflightChecks: the catalog's checks of every plan declared UnderLocks,
// minus DeferredChecks.
func preflightChecks() []string {
	var ids []string
	for _, c := range audit.For(audit.UnderLocks, audit.EveryPlan) {
		if _, deferred := DeferredChecks[c.ID]; !deferred {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// deferredFindings runs the deferred checks that explain SQLSTATE code (in a
// transaction rolled back to before the failed statement).
func deferredFindings(ctx context.Context, tx pgx.Tx, opts Options, code string) (preflight.Result, bool, error) {
	var ids []string
	for id, c := range DeferredChecks {
		if _, err := audit.Lookup(id); err == nil && c == code {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return preflight.Result{}, false, nil
	}
	popts := opts.Preflight
	popts.Checks = ids
	res, err := preflight.Run(ctx, tx, popts)
	return res, true, err
}

// runMigration executes the statements of m one by one (split like the atlas
// CLI splits them), so progress and timings are per statement. The file's own
// LOCK statements find the locks already held. Without savepoints (an
// accepted prepared shape: its unique indexes exist, so no statement can
// fail the way a deferred check explains), two round trips per statement
// fewer under the locks.
func (s *runner) runMigration(tx pgx.Tx, m migrations.Migration, savepoints bool) error {
	ctx, opts, r := s.ctx, s.opts, s.r
	stmts, err := m.Statements()
	if err != nil {
		return fmt.Errorf("splitting %s into statements: %w", m.File, err)
	}
	for i, st := range stmts {
		if isTxControl(st.Text) {
			return fmt.Errorf("%s statement %d is transaction control (%q): apply runs the file in its own transaction", m.File, i+1, summary(st.Text))
		}
		if opts.Hooks.BeforeStatement != nil {
			if err := opts.Hooks.BeforeStatement(ctx, r.BackendPID, m, i, st.Text); err != nil {
				return fmt.Errorf("test hook before statement %d: %w", i, err)
			}
		}
		sum := summary(st.Text)
		if opts.Progress != nil {
			opts.Progress(Event{Step: StepMigrate, Detail: fmt.Sprintf("[%d/%d] %s", i+1, len(stmts), sum)})
		}
		if s.holds(st.Text) {
			// The file's own LOCK of a table apply locked already in that
			// mode (the same order, the same modes: LockPlan): a no-op, so
			// not a round trip under the locks.
			r.Statements = append(r.Statements, StatementReport{Migration: m.Version, Index: i + 1, Summary: "held already (apply's table locks): " + sum})
			continue
		}
		t := time.Now()
		// A savepoint per statement, so a failure the deferred checks
		// explain can be followed by those checks in this transaction.
		if savepoints {
			if _, err := tx.Exec(ctx, `savepoint pgflow_upgrade_stmt`); err != nil {
				return fmt.Errorf("%s statement %d: savepoint: %w", m.File, i+1, err)
			}
		}
		tag, err := tx.Exec(ctx, st.Text)
		if err != nil {
			stmtErr := fmt.Errorf("%s statement %d (%s): %w", m.File, i+1, sum, err)
			var pgErr *pgconn.PgError
			if !savepoints || !errors.As(err, &pgErr) {
				return stmtErr
			}
			if _, rbErr := tx.Exec(ctx, `rollback to savepoint pgflow_upgrade_stmt`); rbErr != nil {
				return stmtErr
			}
			res, ran, ferr := deferredFindings(ctx, tx, opts, pgErr.Code)
			if !ran || ferr != nil || len(res.Blockers()) == 0 {
				return stmtErr
			}
			r.Preflight = append(r.Preflight, res.Checks...)
			r.Blockers = res.Blockers()
			return s.fail(outcome.Refused, fmt.Errorf("%w: %s (found by %s: %w)", outcome.ErrPreflight, res.Summary(), m.File, err))
		}
		if savepoints {
			if _, err := tx.Exec(ctx, `release savepoint pgflow_upgrade_stmt`); err != nil {
				return fmt.Errorf("%s statement %d: release savepoint: %w", m.File, i+1, err)
			}
		}
		took := time.Since(t)
		r.Statements = append(r.Statements, StatementReport{Migration: m.Version, Index: i + 1, Summary: sum,
			DurationMS: took.Milliseconds(), DurationUS: took.Microseconds(), Rows: tag.RowsAffected()})
	}
	return nil
}

// lockStmt: LOCK TABLE schema.table[, ...] IN mode MODE, as the migration
// file writes its own.
var (
	lockStmt  = regexp.MustCompile(`(?is)^\s*lock\s+table\s+(.+?)\s+in\s+(access\s+exclusive|exclusive)\s+mode\s*;?\s*$`)
	lockTable = regexp.MustCompile(`^([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)$`)
)

// holds: stmt is a LOCK TABLE of tables this transaction holds in that
// very mode.
func (s *runner) holds(stmt string) bool {
	m := lockStmt.FindStringSubmatch(stmt)
	if m == nil || s.held == nil {
		return false
	}
	mode := strings.Join(strings.Fields(strings.ToLower(m[2])), " ")
	for _, t := range strings.Split(m[1], ",") {
		if !lockTable.MatchString(strings.ToLower(strings.TrimSpace(t))) || s.held[strings.ToLower(strings.TrimSpace(t))] != mode {
			return false
		}
	}
	return true
}

// summary is a statement on one line, shortened, for progress and reports.
func summary(stmt string) string {
	s := strings.Join(strings.Fields(stmt), " ")
	if len(s) > 72 {
		s = s[:69] + "..."
	}
	return s
}

func isTxControl(stmt string) bool {
	f := strings.Fields(strings.ToLower(strings.TrimSuffix(strings.TrimSpace(stmt), ";")))
	if len(f) == 0 {
		return false
	}
	switch f[0] {
	case "begin", "commit", "rollback", "end", "start":
		return f[0] != "start" || (len(f) > 1 && f[1] == "transaction")
	}
	return false
}
