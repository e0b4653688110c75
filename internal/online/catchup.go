package online

import (
	"context"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// PhaseCatchUp takes a database older than 0.16.0 to 0.16.0 first: the
// online phases start from 0.16.0.
const PhaseCatchUp Phase = "catch_up"

// catchUpTo: 0.16.0 is upstream's first 23 files.
const catchUpTo = 23

// catchUp runs upstream's files up to 0.16.0 (the plan's first hops) in
// one short guarded transaction of upgrade.Apply, when the database is at
// an older release and the user's copy of upstream's files is given. Their
// blocking statement (0.15.1's valid_status CHECK) is built beforehand the
// online way there too. Any other database is left to the phases.
func (e *engine) catchUp(ctx context.Context) error {
	d, err := versions.Detect(ctx, e.conn)
	if err != nil || d.Release == nil || d.Release.Files >= catchUpTo {
		return nil // the phases say what the state is
	}
	o := e.switchOptions()
	o.AcceptState, o.BeforeCommit, o.Quiesce = nil, nil, nil
	o.Preflight = e.opts.Preflight
	o.To = versions.R0_16_0
	return e.phase(PhaseCatchUp, "upstream's files up to 0.16.0, in one guarded transaction", func() error {
		res, err := upgrade.Apply(ctx, e.conn, o)
		e.rep.CatchUp = res
		if res.Report.LockAttempts > 0 {
			e.lockWindow("catch up to 0.16.0", res.Report.LockAttempts, time.Duration(res.Report.LockWindowMS)*time.Millisecond)
		}
		if err != nil {
			e.res.Outcome = res.Outcome
			return fmt.Errorf("online: taking %s to 0.16.0 first: %w", d.Release.Name, err)
		}
		return nil
	})
}
