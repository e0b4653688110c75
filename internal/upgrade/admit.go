package upgrade

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// What apply starts from: the state it reads under its advisory lock, and
// whether a plan may start there (admit), else a refusal naming the state
// and the next step.

// readState reads the schema state and the revisions this tool recorded,
// with r.Pending the migrations not recorded.
func (a *applyRun) readState() error {
	ctx, r, tx, all := a.ctx, a.r, a.tx, a.all
	st, err := versions.DetectSchema(ctx, tx)
	if err != nil {
		return err
	}
	r.State, r.PgflowVersion = st, st.Version
	applied, err := appliedVersions(ctx, tx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, m := range all {
		known[m.Version] = true
		if !applied[m.Version] {
			r.Pending = append(r.Pending, m.Version+"_"+m.Name)
		}
	}
	for v := range applied {
		if !known[v] {
			r.Unknown = append(r.Unknown, v)
		}
	}
	sort.Strings(r.Unknown)
	return nil
}

// admit decides whether apply goes on: from 0.16.0 (or a state AcceptState
// vouches for: then a.accepted), with r.Pending the migrations to run.
// a.done says there is nothing to do (already 0.17.0, whoever applied it);
// an error refuses every other state, naming the version found and the
// next step (internal/versions).
func (a *applyRun) admit() error {
	ctx, r, tx, all := a.ctx, a.r, a.tx, a.all
	var accepted bool
	if q := r.State.Version; q != nil && q.Quiesce != nil && !a.opts.quiesced {
		return a.fail(outcome.Refused, quiesceRefusal(q.Quiesce)) // inprogress.go
	}
	if len(r.Unknown) > 0 {
		// A revision we do not ship: a newer tool upgraded this database
		// further, and this one must not "re-apply" or touch it.
		return a.fail(outcome.Refused, fmt.Errorf("%w: pgflow_upgrade.schema_revisions records %s, which this pgflow-upgrade (migrations up to %s) does not know; use the newer pgflow-upgrade that applied it (`pgflow-upgrade status` lists the revisions)",
			ErrNewerSchema, strings.Join(r.Unknown, ", "), Version))
	}
	if a.opts.AcceptState != nil && r.State.State != versions.SchemaBaseline && r.State.State != versions.SchemaUpgraded {
		ok, err := a.opts.AcceptState(ctx, tx, r.State)
		if err != nil {
			return err
		}
		accepted = ok
	}
	// The plan: from the release found (the shape an online upgrade
	// prepared counts as 0.16.0) to the one asked for.
	from := -1
	switch v := r.State.Version; {
	case accepted:
		from = ownHopFile - 1
	case v != nil && v.Release != nil && v.Online == nil &&
		(r.State.State == versions.SchemaUpgraded || r.State.State == versions.SchemaBaseline || r.State.State == versions.SchemaOlder):
		from = v.Release.Files
	}
	if from >= 0 {
		if err := a.planHops(from); err != nil {
			return err
		}
		if len(a.plan.Hops) == 0 && (from >= ownHopFile || from >= a.target.Files) && !(a.opts.TelemetryOff && from >= 26) {
			if a.pgmq != nil {
				// pgflow is where its hops go: the pgmq hop alone.
				a.pgmqOnly, r.Pending = true, nil
				return nil
			}
			return a.alreadyThere(from)
		}
		switch {
		case a.plan.Has(HopOwn):
			if len(r.Pending) == 0 {
				for _, m := range all {
					r.Pending = append(r.Pending, m.Version+"_"+m.Name)
				}
			}
			a.accepted = accepted
			return nil
		case len(a.plan.Hops) > 0 || from >= ownHopFile:
			r.Pending = nil
			return nil
		}
	}
	switch {
	case r.State.State == versions.SchemaBaseline || accepted:
		// The one state this migration starts from (or one AcceptState vouches for).
		if len(r.Pending) == 0 {
			for _, m := range all {
				r.Pending = append(r.Pending, m.Version+"_"+m.Name)
			}
		}
	case r.State.Version != nil && r.State.Version.Online != nil:
		return a.fail(outcome.Refused, onlineRefusal(r.State.Version)) // inprogress.go
	case r.State.Version.PlanStarts() && a.plan != nil && a.plan.Rest != "":
		// On the road, but upstream's files are not at hand: say what the
		// plan needs, once.
		return a.fail(outcome.Refused, fmt.Errorf("%w: pgflow %s: %s", ErrNoUpstreamFiles, r.State.Version.Release.Name, a.plan.Rest))
	default:
		// Name the version found and the next step (internal/versions).
		why := strings.Join(r.State.Differences, "; ")
		if v := r.State.Version; v != nil {
			why = v.Summary() + ": " + v.NextStep
			if len(r.State.Differences) > 0 {
				why += ": " + strings.Join(r.State.Differences, "; ")
			}
		}
		if a.plan != nil && a.plan.Rest != "" {
			why += "; " + a.plan.Rest
		}
		return a.fail(outcome.Refused, fmt.Errorf("%w: state %s (%s); run `pgflow-upgrade status`", ErrNotBaseline, r.State.State, why))
	}
	a.accepted = accepted
	return nil
}

// alreadyThere ends a run whose plan has nothing to do: the database is
// at the release asked for (or at the furthest this apply can take it
// without upstream's files: the report says what the rest needs).
// 0.17.0 is 0.17.0, whoever applied it: this tool (the revision is
// recorded) or pgflow's own migration 20260915074120 (it is not).
func (a *applyRun) alreadyThere(from int) error {
	r := a.r
	ours := !slices.Contains(r.Pending, Version+"_"+Name)
	r.Pending = nil
	a.res.Outcome = outcome.AlreadyApplied
	found := versions.StateName(from)
	if ours {
		a.res.Message = "already upgraded: pgflow " + found + ", revision " + Version + " (" + Name + ") recorded in pgflow_upgrade.schema_revisions; nothing to do"
	} else {
		a.res.Message = "already upgraded: pgflow " + found + " (not applied by this tool: e.g. by pgflow's own migration " + UpstreamVersion + "); nothing to do"
	}
	if a.plan.Rest != "" {
		a.res.Message = strings.TrimSuffix(a.res.Message, "; nothing to do") + "; nothing to do without upstream's files: " + a.plan.Rest
	} else if from > a.target.Files {
		a.res.Message += " (past --to " + a.target.Name + ")"
	}
	a.done = true
	return nil
}
