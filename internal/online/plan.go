package online

import (
	"context"
)

// operation is one step of the online plan, declared: the phase it is
// reported under, what it does, when a run does it and how, and how
// apply --rollback-online takes it back. needed reads what it needs (the
// catalog's shape, the progress table), so a run after an interruption does
// only what is missing.
type operation struct {
	phase  Phase
	detail string
	needed func(e *engine, ctx context.Context) (bool, error)
	run    func(e *engine, ctx context.Context) error
	undo   undo
}

// undo is how Rollback takes one operation back. Rollback walks the plan
// from its end: first every operation's outside part, then, in one short
// transaction under the ordered table locks, every operation's statements.
// It is not simply each operation reversed in turn: DROP INDEX
// CONCURRENTLY cannot run in a transaction, so contract's indexes go first,
// outside it (the transaction drops any left with IF EXISTS); and the rest
// is one transaction so that a failure leaves the database as it was, not
// half undone. Every statement is IF EXISTS: an interrupted run may have
// made only part of an operation.
type undo struct {
	outside    func(e *engine, ctx context.Context, s Shape) error // nil: nothing outside the transaction
	statements func() []string                                     // nil: nothing in it
}

// plan is apply --online after its gates (integrity, the online lock, an
// open quiesce record, a pgflow schema): the preflight, then expand,
// backfill, contract and the switch, in this order. A function, not a
// variable: the operations' own functions reach Rollback, which walks the
// plan back, and a variable may not refer to itself.
func plan() []operation {
	return []operation{
		// The preflight reads only: nothing to undo.
		{PhaseNone, "preflight: the shared check catalog, exact, no table locks (duplicate message ids: by the index build)",
			(*engine).notUpgraded, (*engine).preflightBefore, undo{}},
		{PhaseExpand, "steps.queue_name and step_tasks.queue_name nullable, insert/update triggers, progress table",
			(*engine).expandNeeded, (*engine).expandThenDetect, undo{statements: undoExpand}},
		// The backfilled values go with expand's columns.
		{PhaseBackfill, "steps in one statement, step_tasks in block-range (ctid) batches",
			(*engine).backfillNeeded, (*engine).backfill, undo{}},
		{PhaseContract, "checks NOT VALID, VALIDATE, three unique indexes CONCURRENTLY",
			(*engine).notUpgraded, (*engine).contractThenDetect, undo{outside: (*engine).dropIndexesConcurrently, statements: undoContract}},
		// Also on a database already switched (or 0.17 reached another way):
		// the switch transaction reports it, and drops a progress table a
		// hand-run file can leave behind. A committed switch is not undone:
		// Rollback refuses it (ErrAlreadySwitched).
		{PhaseSwitch, "fence and function switch in one short transaction (upgrade.Apply), preflight under its locks",
			always, (*engine).switchTx, undo{}},
	}
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
