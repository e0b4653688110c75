package scenario

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
)

// unownedQueue: a pgmq queue named like a flow that no flow owns does not
// block the upgrade (0.17.0's migration never touches it) but apply warns,
// because 0.17.0's create_flow then refuses a flow of that name. The
// scenario checks the three parts: the warning, the queue and its message
// kept as they were, and create_flow's refusal afterwards.
func unownedQueue(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if err := startLegacy(ctx, db, 2); err != nil {
		return err
	}
	if _, err := db.Pool.Exec(ctx, `select pgmq.create('orphan'); select pgmq.send('orphan', '{"left": "behind"}'::jsonb)`); err != nil {
		return fmt.Errorf("creating a queue no flow owns: %w", err)
	}
	before, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	rep, err := env.Upgrade(ctx, db)
	if err != nil {
		return fmt.Errorf("apply refused a database whose only oddity is a queue no flow owns (a warning): %w", err)
	}
	var warning string
	if rep != nil {
		for _, c := range rep.Report.Preflight {
			for _, f := range c.Findings {
				if c.ID == "pgmq.unowned_queue" && f.Severity == audit.Warning && strings.Contains(fmt.Sprint(f.Samples), "orphan") {
					warning = f.Message
				}
			}
		}
	}
	if warning == "" {
		return errorf("apply did not warn about the queue 'orphan' no flow owns (pgmq.unowned_queue)")
	}
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return err
	}
	if d := fingerprint.Compare(before, after); len(d) > 0 {
		return fmt.Errorf("%d differences in pre-existing state after the upgrade:\n%s", len(d), fingerprint.Format(d, 20))
	}
	left, err := CountRows(ctx, db, `select count(*) from pgmq.q_orphan`)
	if err != nil {
		return err
	}
	if left != 1 {
		return errorf("the queue no flow owns holds %d messages after the upgrade, want its 1", left)
	}
	_, cerr := db.Pool.Exec(ctx, `select pgflow.create_flow('orphan')`)
	if code := SQLState(cerr); code != "23505" {
		return fmt.Errorf("create_flow('orphan') after the upgrade: SQLSTATE %q, want 23505 (0.17.0 refuses a flow whose queue name is taken): %v", code, cerr)
	}
	flows, err := CountRows(ctx, db, `select count(*) from pgflow.flows where lower(flow_slug) = 'orphan'`)
	if err != nil {
		return err
	}
	if flows != 0 {
		return errorf("create_flow('orphan') was refused but left %d flow rows", flows)
	}
	env.Notef("warned: %s; then create_flow('orphan'): %s", warning, firstLine(cerr.Error()))
	return nil
}
