// Package preflight runs the shared check catalog (package audit) inside
// apply's transaction, exactly and under apply's table locks, and turns what
// it finds into a refusal: while the tables are locked nothing can change
// between the checks and the migration, so "no blocker" really means the
// migration's constraints will hold.
//
// It adds only what apply alone needs: the privileges check (the role must be
// able to alter the pgflow tables and replace its functions), which apply runs
// before it takes any lock so a role that cannot upgrade never queues for one.
// Every data check lives in audit's catalog, so `audit` and `apply` can never
// disagree about what blocks the upgrade.
package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// Result is what the preflight found.
type Result struct {
	Checks []audit.CheckResult `json:"checks"`
}

// Blockers returns every blocker finding.
func (r Result) Blockers() []audit.Finding {
	var out []audit.Finding
	for _, c := range r.Checks {
		for _, f := range c.Findings {
			if f.Severity == audit.Blocker {
				out = append(out, f)
			}
		}
	}
	return out
}

// Unproven returns the checks that could not give an answer (errored or ran
// out of time): apply cannot prove the migration safe while any exist.
func (r Result) Unproven() []audit.CheckResult {
	var out []audit.CheckResult
	for _, c := range r.Checks {
		if c.Status == audit.StatusError || c.Status == audit.StatusInconclusive {
			out = append(out, c)
		}
	}
	return out
}

// Inconclusive says whether every unproven check only ran out of time.
func (r Result) Inconclusive() bool {
	u := r.Unproven()
	for _, c := range u {
		if c.Status != audit.StatusInconclusive {
			return false
		}
	}
	return len(u) > 0
}

// OK says apply may go on: no blocker, nothing unproven.
func (r Result) OK() bool { return len(r.Blockers()) == 0 && len(r.Unproven()) == 0 }

// Summary is a one-line description of a refusal.
func (r Result) Summary() string {
	var parts []string
	if b := r.Blockers(); len(b) > 0 {
		parts = append(parts, fmt.Sprintf("%d blocker(s)", len(b)))
	}
	if u := r.Unproven(); len(u) > 0 {
		ids := make([]string, len(u))
		for i, c := range u {
			ids[i] = c.ID + " (" + string(c.Status) + ")"
		}
		parts = append(parts, "checks without an answer: "+strings.Join(ids, ", "))
	}
	if len(parts) == 0 {
		return "no blockers"
	}
	return strings.Join(parts, "; ")
}

// applyChecks are the checks only apply runs (not in audit's catalog: the
// audit never writes), each declaring when.
func applyChecks() []audit.Check { return []audit.Check{PrivilegesCheck()} }

// Run runs the catalog's checks declared UnderLocks for opts.Hop (or
// opts.Checks) in tx (apply's transaction, after its table locks), exact,
// plus apply's own checks declared UnderLocks. The checks run in savepoints
// that are rolled back, so tx is as before.
func Run(ctx context.Context, tx pgx.Tx, opts audit.Options) (Result, error) {
	for _, c := range applyChecks() {
		if c.Runs.Has(audit.UnderLocks) && c.Hop == opts.Hop {
			opts.Extra = append(opts.Extra, c)
		}
	}
	if opts.ApplicationName == "" {
		opts.ApplicationName = "pgflow-upgrade apply"
	}
	res, err := audit.RunPreflight(ctx, tx, opts)
	if err != nil {
		return Result{Checks: res}, fmt.Errorf("running the preflight checks: %w", err)
	}
	return Result{Checks: res}, nil
}
