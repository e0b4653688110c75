package upgrade

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// StepReleaseAfter reads the whole catalog after the commit when the
// transaction checked the release reached by its scope (reachedScoped).
const StepReleaseAfter = "release_after_commit"

// ErrAfterCommit: the whole catalog, read after a commit whose transaction
// checked the objects its plan changes, is not the release reached.
var ErrAfterCommit = errors.New("the whole catalog read after the commit is not at the release the plan reached")

// reachedCheck is a post-condition: the database is at the release the
// plan reached. got, when not nil, is schema pgflow's whole catalog read
// by the 0.17 checks in this transaction: detection reads nothing more of
// it. Otherwise, when the transaction started from an exact release
// (reachedScoped), only the objects the plan changes are read under the
// locks; else the whole catalog is.
func (a *applyRun) reachedCheck(got *catalog.Catalog) (CheckOutcome, error) {
	o := CheckOutcome{ID: "release_reached", Title: "the database is at the release the plan reached: " + a.plan.Reached}
	var d *versions.Detection
	var err error
	if got != nil {
		d, err = versions.DetectCatalog(a.ctx, a.tx, got)
	} else {
		var done bool
		if o, done, err = a.reachedScoped(o); done || err != nil {
			return o, err
		}
		d, err = versions.Detect(a.ctx, a.tx)
	}
	if err != nil {
		return o, err
	}
	switch {
	case d.Release == nil:
		o.Detail = "detected " + d.Summary()
	case d.Release.Files != a.plan.ReachedFiles:
		o.Detail = "detected " + d.Release.Name + " (" + strings.Join(d.Release.Evidence, "; ") + ")"
	default:
		o.OK, o.Detail = true, d.Release.Name
	}
	return o, nil
}

// reachedScoped checks the release reached from what the plan changes
// (done false: it does not apply, the whole catalog is read instead).
//
// Why that is enough to be sure: the transaction read the whole catalog
// before its table locks (the state step) and found exactly the start
// release S (with any objects of the user's own); the plan then ran
// upstream's files, verified by their hashes, and this tool's statements
// in place of some of theirs. Every object whose description differs
// between S and the release reached T is read here, under the locks, and
// must be T's, none of S's that T lacks may remain, and the release's own
// evidence (the digests of body-only files, the Supabase ledger) must say
// T. Every other object was S's at the start, which is T's. The whole
// catalog is read again after the commit (StepReleaseAfter).
func (a *applyRun) reachedScoped(o CheckOutcome) (CheckOutcome, bool, error) {
	start := a.r.State.Version
	if a.accepted || start == nil || start.Release == nil || start.Shallow || start.Version == nil ||
		start.State == versions.StateUnknown || start.State == versions.StateOnline || start.Quiesce != nil {
		return o, false, nil
	}
	s, ok := versions.CatalogOf(start.Release.Files)
	if !ok || s.Name != start.Version.Name {
		return o, false, nil
	}
	t, ok := versions.CatalogOf(a.plan.ReachedFiles)
	if !ok {
		return o, false, nil
	}
	scope, ok := catalog.ScopeOf(catalog.Diff(s.Catalog, t.Catalog))
	if !ok {
		return o, false, nil
	}
	got, err := catalog.ReadScope(a.ctx, a.tx, versions.Schema, scope)
	if err != nil {
		return o, true, err
	}
	if bad := scopeDifferences(s, t, scope, got); len(bad) > 0 {
		o.Detail = "what the plan changes is not " + t.Name + "'s: " + strings.Join(bad, "; ")
		return o, true, nil
	}
	rel, err := versions.DetectRelease(a.ctx, a.tx, &versions.Detection{Found: t.Name, State: t.State})
	if err != nil {
		return o, true, err
	}
	if rel == nil || rel.Files != a.plan.ReachedFiles {
		o.Detail = "the release's evidence says otherwise"
		if rel != nil {
			o.Detail += ": " + rel.Name + " (" + strings.Join(rel.Evidence, "; ") + ")"
		}
		return o, true, nil
	}
	a.wholeAfterCommit = true
	o.OK = true
	o.Detail = fmt.Sprintf("%s (under the locks: the %d tables and %d functions the plan changes from %s, read alone; the whole catalog was %s's before the locks, and is read again after the commit)",
		rel.Name, len(scope.Tables), len(scope.Functions), start.Release.Name, start.Release.Name)
	return o, true, nil
}

// releaseAfterCommit reads the whole catalog once the locks are gone,
// after a transaction that checked the release reached by its scope.
func (a *applyRun) releaseAfterCommit() error {
	d, err := versions.Detect(a.ctx, a.conn)
	if err != nil {
		return fmt.Errorf("reading the catalog after the commit: %w", err)
	}
	if d.Release == nil || d.Release.Files != a.plan.ReachedFiles {
		a.res.Outcome = outcome.Failed
		return fmt.Errorf("%w: committed, then read as %s instead of %s (changed by another session meanwhile?); run `pgflow-upgrade status` and `pgflow-upgrade verify`",
			ErrAfterCommit, d.Summary(), a.plan.Reached)
	}
	return nil
}

// scopeDifferences says how got, a read of scope, is not release t's
// (nothing: it is), after a plan from release s: what t has that got lacks
// or has differently, and what of s's that t lacks is still there. Other
// objects got has are the user's own, tolerated as detection tolerates them.
func scopeDifferences(s, t *versions.Version, scope catalog.Scope, got *catalog.Catalog) []string {
	wantT, wantS := t.Catalog.Restrict(scope), s.Catalog.Restrict(scope)
	var bad []string
	for _, d := range catalog.Missing(wantT, got) {
		bad = append(bad, d.String())
	}
	// Not extra to s: s has it, and the plan left it behind.
	users := map[string]bool{}
	for _, d := range catalog.Diff(wantS, got) {
		if d.Change == catalog.ChangeExtra {
			users[string(d.Kind)+" "+d.Object] = true
		}
	}
	for _, d := range catalog.Diff(wantT, got) {
		// Extra columns: Missing named them already.
		if d.Change == catalog.ChangeExtra && d.Kind != catalog.KindColumn && !users[string(d.Kind)+" "+d.Object] {
			bad = append(bad, string(d.Kind)+" "+d.Object+": still there ("+s.Name+"'s, not "+t.Name+"'s)")
		}
	}
	return bad
}
