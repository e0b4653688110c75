package online

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Progress is the row of pgflow_upgrade.online_progress.
type Progress struct {
	Phase string `json:"phase"`
	// NextBlock: the step_tasks block (physical page) the backfill's current
	// pass continues from; every block before it has been swept.
	NextBlock int64 `json:"next_block"`
	// EndBlock: the table's size in blocks when the pass began (0: not yet
	// known). Rows past it were written during the pass: by the backfill
	// itself (an UPDATE moves a row to wherever there is room) or through the
	// triggers, so they are filled and the pass ends there.
	EndBlock  int64     `json:"end_block"`
	Pass      int32     `json:"pass"`       // backfill pass (a second pass revisits rows skipped as locked)
	RowsDone  int64     `json:"rows_done"`  // rows the backfill has filled so far
	RowsTotal int64     `json:"rows_total"` // step_tasks rows when the backfill started (estimate)
	Batches   int64     `json:"batches"`
	Rate      float64   `json:"rate"` // rows/s of the most recent run
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// RowsLeft is an estimate (the total is pg_class.reltuples at the start).
func (p Progress) RowsLeft() int64 {
	if p.RowsTotal <= p.RowsDone {
		return 0
	}
	return p.RowsTotal - p.RowsDone
}

// progressDDL creates our schema, the progress table and the trigger
// function. Idempotent; touches no pgflow table. The schema is shared with
// internal/upgrade's ledger (pgflow_upgrade.schema_revisions), so the online
// path only ever drops its own two objects.
const progressDDL = `
create schema if not exists pgflow_upgrade;
create table if not exists pgflow_upgrade.online_progress (
  id              boolean primary key default true check (id), -- one row
  phase           text not null,
  next_block      bigint not null default 0,
  end_block       bigint not null default 0,
  pass            integer not null default 1,
  rows_done       bigint not null default 0,
  rows_total      bigint not null default 0,
  batches         bigint not null default 0,
  rate            double precision not null default 0,
  started_at      timestamptz not null default pg_catalog.now(),
  updated_at      timestamptz not null default pg_catalog.now()
);
-- A progress row of an earlier pgflow-upgrade (key-ordered batches) gains
-- the block cursor; expand then restarts the pass.
alter table pgflow_upgrade.online_progress add column if not exists next_block bigint not null default 0,
  add column if not exists end_block bigint not null default 0;
-- Rows the 0.16.0 engine inserts into steps and step_tasks while the online
-- upgrade runs get 0.17.0's flow-mode queue, lower(flow_slug), and so does a
-- row it updates while still unfilled: an UPDATE writes a new row version
-- wherever there is room, possibly in a block the backfill has passed. The
-- triggers fire only WHEN (new.queue_name is null), so an update of a filled
-- row never enters PL/pgSQL. The switch drops the triggers; 0.17.0 has none.
create or replace function pgflow_upgrade.online_fill_queue_name()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  new.queue_name := coalesce(new.queue_name, pg_catalog.lower(new.flow_slug));
  return new;
end
$$;`

// dropBookkeeping removes the online path's own objects (not the schema:
// internal/upgrade keeps its ledger there). The triggers using the function
// must be gone already.
const dropBookkeeping = `
drop table if exists pgflow_upgrade.online_progress;
drop function if exists pgflow_upgrade.online_fill_queue_name();`

// ReadProgress reads the progress row (ok false when there is none).
func ReadProgress(ctx context.Context, q Querier) (p Progress, ok bool, err error) {
	var exists bool
	if err := q.QueryRow(ctx, `select pg_catalog.to_regclass($1) is not null`, ProgressTable).Scan(&exists); err != nil {
		return p, false, fmt.Errorf("online: looking for %s: %w", ProgressTable, err)
	}
	if !exists {
		return p, false, nil
	}
	err = q.QueryRow(ctx, `
		select phase, next_block, end_block, pass, rows_done, rows_total, batches, rate, started_at, updated_at
		from pgflow_upgrade.online_progress where id`).Scan(
		&p.Phase, &p.NextBlock, &p.EndBlock, &p.Pass, &p.RowsDone, &p.RowsTotal, &p.Batches, &p.Rate, &p.StartedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("online: reading %s: %w", ProgressTable, err)
	}
	return p, true, nil
}

// setPhase records the phase (the row exists from expand on).
func setPhase(ctx context.Context, q Querier, ph Phase) error {
	if _, err := q.Exec(ctx, `update pgflow_upgrade.online_progress set phase = $1, updated_at = pg_catalog.now() where id`, string(ph)); err != nil {
		return fmt.Errorf("online: recording phase %s: %w", ph, err)
	}
	return nil
}

// Commands that continue or undo an online upgrade in progress.
const (
	ContinueCommand = versions.ContinueOnline
	UndoCommand     = versions.UndoOnline
)

// StatusInfo is what `status` shows of an online upgrade.
type StatusInfo struct {
	Phase Phase `json:"phase"`
	// Next: the command that continues the upgrade from Phase; Undo the one
	// that returns to 0.16.0 (both empty when nothing is in progress).
	Next     string    `json:"next,omitempty"`
	Undo     string    `json:"undo,omitempty"`
	Shape    Shape     `json:"shape"`
	Progress *Progress `json:"progress,omitempty"`
	RowsLeft int64     `json:"rows_left"`
	// ETASeconds: rows left at the last recorded rate (0 when unknown).
	ETASeconds float64 `json:"eta_seconds"`
}

// InProgress: an online upgrade has begun and the switch has not happened.
func (s *StatusInfo) InProgress() bool {
	return s != nil && s.Phase != PhaseNone && s.Phase != PhaseDone
}

// ReadStatus reads the online upgrade's state (catalog and the progress row)
// through q, e.g. status's READ ONLY transaction.
func ReadStatus(ctx context.Context, q Querier) (*StatusInfo, error) {
	s, err := ReadShape(ctx, q)
	if err != nil {
		return nil, err
	}
	info := &StatusInfo{Phase: s.Phase(), Shape: s}
	if info.InProgress() {
		info.Next, info.Undo = ContinueCommand, UndoCommand
	}
	p, ok, err := ReadProgress(ctx, q)
	if err != nil {
		return nil, err
	}
	if ok {
		info.Progress = &p
		if info.Phase == PhaseBackfill {
			info.RowsLeft = p.RowsLeft()
			if p.Rate > 0 {
				info.ETASeconds = float64(info.RowsLeft) / p.Rate
			}
		}
	}
	return info, nil
}

// Annotate says whether s is the online upgrade in progress that d names
// (versions.Detect finds it from the same catalog reading; a detection made
// before the upgrade started is brought up to date). Only a database that
// is 0.16.0 (the expand has begun) or unknown (0.16.0 plus what the online
// path adds) can be one: the Shape alone cannot tell a finished 0.17.x
// (its queue_name columns) from a backfill.
func (s *StatusInfo) Annotate(d *versions.Detection) bool {
	if !s.InProgress() || d == nil {
		return false
	}
	switch d.State {
	case versions.StateOnline:
		return true
	case versions.StateUnknown, versions.StateReady:
		d.SetOnline(string(s.Phase))
		return true
	}
	return false
}
