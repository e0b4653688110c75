package online

import (
	"context"
)

// operation is one step of the online plan, declared: the phase it is
// reported under, what it does, when a run does it and how. needed reads
// what it needs (the catalog's shape, the progress table), so a run after
// an interruption does only what is missing. The undo of the operations
// before the switch is Rollback (apply --rollback-online): contract's
// unique indexes first (concurrently, outside a transaction), then in one
// short transaction what expand and contract added, table by table
// (trigger, checks, column), is_valid_queue_name and the bookkeeping; the
// backfilled values go with the columns, the preflight changes nothing, and
// a committed switch is not undone.
type operation struct {
	phase  Phase
	detail string
	needed func(e *engine, ctx context.Context) (bool, error)
	run    func(e *engine, ctx context.Context) error
}

// plan is apply --online after its gates (integrity, the online lock, an
// open quiesce record, a pgflow schema): the preflight, then expand,
// backfill, contract and the switch, in this order.
var plan = []operation{
	{PhaseNone, "preflight: the shared check catalog, exact, no table locks (duplicate message ids: by the index build)",
		(*engine).notUpgraded, (*engine).preflightBefore},
	{PhaseExpand, "steps.queue_name and step_tasks.queue_name nullable, insert/update triggers, progress table",
		(*engine).expandNeeded, (*engine).expandThenDetect},
	{PhaseBackfill, "steps in one statement, step_tasks in block-range (ctid) batches",
		(*engine).backfillNeeded, (*engine).backfill},
	{PhaseContract, "checks NOT VALID, VALIDATE, three unique indexes CONCURRENTLY",
		(*engine).notUpgraded, (*engine).contractThenDetect},
	// Also on a database already switched (or 0.17 reached another way):
	// the switch transaction reports it, and drops a progress table a
	// hand-run file can leave behind.
	{PhaseSwitch, "fence and function switch in one short transaction (upgrade.Apply), preflight under its locks",
		always, (*engine).switchTx},
}

func always(*engine, context.Context) (bool, error) { return true, nil }

// notUpgraded: every operation but the switch is for a database not yet
// switched.
func (e *engine) notUpgraded(context.Context) (bool, error) { return !e.shape.Upgraded, nil }

// expandNeeded: a column, a trigger or the progress table is missing.
func (e *engine) expandNeeded(context.Context) (bool, error) {
	s := e.shape
	return !s.Upgraded && (s.Columns < len(Tables) || s.TriggersFull < len(Tables) || !s.Progress), nil
}

// backfillNeeded: no check is there yet and the progress table does not
// say the backfill finished.
func (e *engine) backfillNeeded(ctx context.Context) (bool, error) {
	if e.shape.Upgraded {
		return false, nil
	}
	p, _, err := ReadProgress(ctx, e.conn)
	if err != nil {
		return false, err
	}
	return e.shape.Checks == 0 && p.Phase != string(PhaseContract), nil
}

// expandThenDetect expands, then reads the shape expand left.
func (e *engine) expandThenDetect(ctx context.Context) error {
	if err := e.expand(ctx); err != nil {
		return err
	}
	return e.detect(ctx)
}

// contractThenDetect contracts, then reads the shape the switch starts from.
func (e *engine) contractThenDetect(ctx context.Context) error {
	if err := e.contract(ctx); err != nil {
		return err
	}
	return e.detect(ctx)
}

func (e *engine) detect(ctx context.Context) error {
	s, err := ReadShape(ctx, e.conn)
	if err != nil {
		return err
	}
	e.shape = s
	return nil
}
