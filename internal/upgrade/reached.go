package upgrade

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// StepReleaseAfter reads the whole catalog after the commit when the
// transaction's post-conditions read only what the plan changes (scoped).
const StepReleaseAfter = "release_after_commit"

// afterCommitReadTimeout bounds each statement of that read (the catalog
// of schema pgflow: tens of milliseconds).
const afterCommitReadTimeout = time.Minute

// ErrAfterCommit: the whole catalog, read after a commit whose transaction
// checked the objects its plan changes, is not what the plan reached.
var ErrAfterCommit = errors.New("the whole catalog read after the commit is not what the plan reached")

// scoped is the post-conditions' read under the locks when it may be
// narrowed to the objects the plan changes (scopeOf).
//
// Why that is enough to be sure: the transaction read the whole catalog
// before its table locks (the state step, kept as the start catalog) and
// it was release s's (this tool's prepared shape, for apply --online's
// switch, adds only objects on the tables the plan changes), with any
// objects of the user's own; the plan then ran upstream's files, verified
// by their hashes, and this tool's own statements. Every object whose
// description differs between s and the release reached t is read here,
// under the locks, and must be t's (none of s's that t lacks may remain),
// and the release's own evidence (the digests of body-only files, the
// Supabase ledger) must say t. Every other object was s's when the
// transaction read it, which is t's. What only a whole read sees (another
// session's DDL between that read and the locks) is looked for by reading
// the whole catalog again after the commit (StepReleaseAfter).
type scoped struct {
	s, t         *versions.Version
	scope        catalog.Scope
	wantS, wantT *catalog.Catalog // s's and t's descriptions restricted to the scope
	got          *catalog.Catalog // the scope, read under the locks
	// prepared: the scope's read, prepared and planned before the locks
	// (nil where prepared statements do not reach the server).
	prepared *catalog.PreparedScope
}

// prepareScope decides, before the table locks, whether the
// post-conditions read the plan's scope alone, and restricts the
// descriptions to it: under the locks only the read and the comparisons
// are left.
func (a *applyRun) prepareScope() error {
	if a.opts.DryRun {
		return nil // nothing is committed, so nothing is read after: the whole catalog now
	}
	if sc, ok := a.scopeOf(); ok {
		sc.wantS, sc.wantT = sc.s.Catalog.Restrict(sc.scope), sc.t.Catalog.Restrict(sc.scope)
		p, ok, err := catalog.PrepareScope(a.ctx, a.tx, versions.Schema, sc.scope)
		if err != nil {
			return err
		}
		if ok {
			sc.prepared = p
		}
		a.scope = sc
	}
	return nil
}

// closeScope deallocates the scope's prepared read, whatever happened
// (it outlives a rollback).
func (a *applyRun) closeScope() error {
	if a.scope == nil || a.scope.prepared == nil || a.conn.IsClosed() {
		return nil
	}
	p := a.scope.prepared
	a.scope.prepared = nil
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 10*time.Second)
	defer cancel()
	return p.Close(ctx, a.conn)
}

// scopeOf says whether the post-conditions may read the plan's scope
// alone: the start catalog was read whole, it is s's outside what the plan
// changes, and both ends have a description.
func (a *applyRun) scopeOf() (*scoped, bool) {
	start := a.r.State.Version
	if a.plan == nil || start == nil || start.Catalog == nil || start.Shallow || start.Quiesce != nil {
		return nil, false
	}
	from := ownHopFile - 1 // the prepared shape is 0.16.0's with the online objects
	if !a.accepted {
		if start.Release == nil {
			return nil, false
		}
		from = start.Release.Files
	}
	s, ok := versions.CatalogOf(from)
	if !ok {
		return nil, false
	}
	t, ok := versions.CatalogOf(a.plan.ReachedFiles)
	if !ok {
		return nil, false
	}
	scope, ok := catalog.ScopeOf(catalog.Diff(s.Catalog, t.Catalog))
	if !ok {
		return nil, false
	}
	// Outside the scope the start catalog has s's objects as described:
	// anything else there is the user's own (tolerated, untouched).
	for _, d := range catalog.Diff(s.Catalog, start.Catalog) {
		if d.Change == catalog.ChangeExtra || d.Kind == catalog.KindPGMQ {
			continue
		}
		in, ok := catalog.ScopeOf([]catalog.Difference{d})
		if !ok || !within(in, scope) {
			return nil, false
		}
	}
	return &scoped{s: s, t: t, scope: scope}, true
}

// within: every name of in is one of scope's.
func within(in, scope catalog.Scope) bool {
	for _, x := range in.Tables {
		if !slices.Contains(scope.Tables, x) {
			return false
		}
	}
	for _, x := range in.Functions {
		if !slices.Contains(scope.Functions, x) {
			return false
		}
	}
	return true
}

// scopedPostConditions are the post-conditions on the scope read alone:
// the 0.17 checks (their catalog comparison on the scope, their SQL checks
// as they are) when the plan reaches 0.17, and the release reached.
func (a *applyRun) scopedPostConditions(sc *scoped) ([]CheckOutcome, error) {
	var got *catalog.Catalog
	var err error
	if sc.prepared != nil {
		got, err = sc.prepared.Read(a.ctx, a.tx)
		if err == nil {
			err = a.closeScope()
		}
	} else {
		got, err = catalog.ReadScope(a.ctx, a.tx, versions.Schema, sc.scope)
	}
	if err != nil {
		return nil, err
	}
	sc.got = got
	var out []CheckOutcome
	if a.plan.ReachedFiles >= ownHopFile {
		out, err = runPostConditions(a.ctx, a.tx, true, postConditions(func(context.Context, Querier) (bool, string, error) {
			same := fmt.Sprintf("equal to pgflow %s on what the plan changes (%d tables and %d functions, read alone under the locks; "+
				"the whole catalog was read before them and is compared again after the commit)", sc.t.Name, len(sc.scope.Tables), len(sc.scope.Functions))
			ok, detail := compareCatalog(sc.wantT, got, same)
			return ok, detail, nil
		}))
		if err != nil {
			return out, err
		}
	}
	o, err := a.reachedByScope(sc)
	if err != nil {
		return out, err
	}
	a.wholeAfterCommit = true
	return append(out, o), nil
}

// reachedByScope is the release reached, on the scope: t's objects, none
// of s's that t lacks, and the release's evidence.
func (a *applyRun) reachedByScope(sc *scoped) (CheckOutcome, error) {
	o := CheckOutcome{ID: "release_reached", Title: "the database is at the release the plan reached: " + a.plan.Reached}
	if bad := scopeDifferences(sc, sc.got); len(bad) > 0 {
		o.Detail = "what the plan changes is not " + sc.t.Name + "'s: " + strings.Join(bad, "; ")
		return o, nil
	}
	rel, err := versions.DetectRelease(a.ctx, a.tx, &versions.Detection{Found: sc.t.Name, State: sc.t.State})
	if err != nil {
		return o, err
	}
	if rel == nil || rel.Files != a.plan.ReachedFiles {
		o.Detail = "the release's evidence says otherwise"
		if rel != nil {
			o.Detail += ": " + rel.Name + " (" + strings.Join(rel.Evidence, "; ") + ")"
		}
		return o, nil
	}
	o.OK = true
	o.Detail = fmt.Sprintf("%s (under the locks: the %d tables and %d functions the plan changes from %s, read alone; the whole catalog was read before them, and is read again after the commit)",
		rel.Name, len(sc.scope.Tables), len(sc.scope.Functions), sc.s.Name)
	return o, nil
}

// reachedCheck is the release reached on the whole catalog: got, when not
// nil, is schema pgflow's whole catalog read by the 0.17 checks in this
// transaction, and detection reads nothing more of it.
func (a *applyRun) reachedCheck(q Querier, got *catalog.Catalog) (CheckOutcome, error) {
	o := CheckOutcome{ID: "release_reached", Title: "the database is at the release the plan reached: " + a.plan.Reached}
	var d *versions.Detection
	var err error
	if got != nil {
		d, err = versions.DetectCatalog(a.ctx, q, got)
	} else {
		d, err = versions.Detect(a.ctx, q)
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

// wholePostConditions are the post-conditions on the whole catalog, read
// once for the 0.17 comparison and the release reached.
func (a *applyRun) wholePostConditions(q Querier, inTx bool) ([]CheckOutcome, error) {
	var out []CheckOutcome
	var err error
	var got *catalog.Catalog
	if a.plan == nil || a.plan.ReachedFiles >= ownHopFile {
		// 0.17's checks.
		out, err = runPostConditions(a.ctx, q, inTx, postConditions(func(ctx context.Context, q Querier) (bool, string, error) {
			c, err := catalog.Read(ctx, q, versions.Schema)
			if err != nil {
				return false, "", err
			}
			got = c
			return catalogIs017(c)
		}))
	}
	if err == nil && a.plan != nil {
		var o CheckOutcome
		if o, err = a.reachedCheck(q, got); err == nil {
			out = append(out, o)
		}
	}
	return out, err
}

// releaseAfterCommit reads the whole catalog once the locks are gone,
// after a transaction whose post-conditions read only the plan's scope.
// It reads in a read-only transaction of its own: through a transaction
// pooler the search_path is pinned per transaction only, and a statement
// outside one would resolve names on the server session's own path.
func (a *applyRun) releaseAfterCommit() error {
	tx, err := session.BeginReadOnly(a.ctx, a.conn, afterCommitReadTimeout, a.opts.LockTimeout, "pgflow-upgrade apply (catalog after the commit)")
	if err != nil {
		return fmt.Errorf("reading the catalog after the commit: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(a.ctx))
	out, err := a.wholePostConditions(tx, true)
	if err != nil {
		return fmt.Errorf("reading the catalog after the commit: %w", err)
	}
	if bad := Failed(out); len(bad) > 0 {
		a.res.Outcome = outcome.Failed
		ids := make([]string, len(bad))
		for i, b := range bad {
			ids[i] = b.ID + ": " + b.Detail
		}
		return fmt.Errorf("%w: committed, then %s (changed by another session meanwhile?); run `pgflow-upgrade status` and `pgflow-upgrade verify`",
			ErrAfterCommit, strings.Join(ids, "; "))
	}
	return nil
}

// scopeDifferences says how got, a read of sc's scope, is not release
// t's (nothing: it is), after a plan from release s: what t has that got
// lacks or has differently, and what of s's that t lacks is still there.
// Other objects got has are the user's own, tolerated as detection
// tolerates them.
func scopeDifferences(sc *scoped, got *catalog.Catalog) []string {
	var bad []string
	for _, d := range catalog.Missing(sc.wantT, got) {
		bad = append(bad, d.String())
	}
	// Not extra to s: s has it, and the plan left it behind.
	users := map[string]bool{}
	for _, d := range catalog.Diff(sc.wantS, got) {
		if d.Change == catalog.ChangeExtra {
			users[string(d.Kind)+" "+d.Object] = true
		}
	}
	for _, d := range catalog.Diff(sc.wantT, got) {
		// Extra columns: Missing named them already.
		if d.Change == catalog.ChangeExtra && d.Kind != catalog.KindColumn && !users[string(d.Kind)+" "+d.Object] {
			bad = append(bad, string(d.Kind)+" "+d.Object+": still there ("+sc.s.Name+"'s, not "+sc.t.Name+"'s)")
		}
	}
	return bad
}
