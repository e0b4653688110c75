package quiesce

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions/quiescerecord"
)

// The record's reading lives in internal/versions/quiescerecord (the
// version detection reads it too); these names are the same things.
type (
	// Querier is what the read-only parts query through (pgx.Tx, *pgx.Conn).
	Querier = session.Querier
	// Phase of a recorded quiesce.
	Phase = quiescerecord.Phase
	// Item is one recorded value.
	Item = quiescerecord.Item
	// State is a recorded quiesce.
	State = quiescerecord.State
)

// Tables of the recorded state (schema pgflow_upgrade).
const (
	StateTable = quiescerecord.StateTable
	ItemsTable = quiescerecord.ItemsTable
)

const (
	PhasePaused     = quiescerecord.PhasePaused     // functions disabled, crons paused, values recorded
	PhaseDeprecated = quiescerecord.PhaseDeprecated // live 0.16.0 workers deprecated
	PhaseDrained    = quiescerecord.PhaseDrained    // no task started by a live worker
	PhaseApplied    = quiescerecord.PhaseApplied    // the upgrade committed; only the restore is left
)

// Item kinds of pgflow_upgrade.quiesce_items.
const (
	KindFunction = quiescerecord.KindFunction // name: function_name; recorded: enabled
	KindCronJob  = quiescerecord.KindCronJob  // name: jobid; label: jobname; recorded: active
)

// Modes: which apply started the quiesce (resume runs the same one).
const (
	ModeApply  = quiescerecord.ModeApply
	ModeOnline = quiescerecord.ModeOnline
)

// UndoCommand restores a recorded quiesce without upgrading.
const UndoCommand = quiescerecord.UndoCommand

// ResumeCommand is the command that finishes a quiesce of mode.
func ResumeCommand(mode string) string { return quiescerecord.ResumeCommand(mode) }

// Load reads the recorded quiesce; nil when there is none.
func Load(ctx context.Context, q Querier) (*State, error) { return quiescerecord.Load(ctx, q) }

// Find is Load for readers that may lack privileges on the tool's schema
// (quiescerecord.Find).
func Find(ctx context.Context, q Querier) (s *State, unreadable bool, err error) {
	return quiescerecord.Find(ctx, q)
}

const ddl = `
create schema if not exists pgflow_upgrade;
create table if not exists pgflow_upgrade.quiesce (
  singleton          boolean primary key default true check (singleton),
  phase              text not null check (phase in ('paused', 'deprecated', 'drained', 'applied')),
  mode               text not null,
  workers_deprecated integer not null default 0,
  started_at         timestamptz not null default pg_catalog.now(),
  updated_at         timestamptz not null default pg_catalog.now()
);
create table if not exists pgflow_upgrade.quiesce_items (
  kind     text not null check (kind in ('function', 'cron_job')),
  name     text not null,
  label    text,
  recorded boolean not null,
  primary key (kind, name)
);
comment on table pgflow_upgrade.quiesce is
  'pgflow-upgrade apply --quiesce in progress: its phase (finish: apply --resume-quiesce; undo: apply --undo-quiesce)';
comment on table pgflow_upgrade.quiesce_items is
  'pgflow-upgrade apply --quiesce: worker_functions.enabled and pgflow cron job active values recorded before they were changed'`

// setPhase advances the recorded phase in tx.
func setPhase(ctx context.Context, tx pgx.Tx, p Phase) error {
	tag, err := tx.Exec(ctx, `update pgflow_upgrade.quiesce set phase = $1, updated_at = pg_catalog.now()`, string(p))
	if err != nil {
		return fmt.Errorf("recording quiesce phase %s in %s: %w", p, StateTable, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("recording quiesce phase %s: %s has no quiesce in progress (undone by another session?)", p, StateTable)
	}
	return nil
}

// Mark records, in the caller's upgrade transaction, that the upgrade is
// applied: committed with the migration, so a crash after it leaves only
// the restore to do. Without a recorded quiesce it does nothing.
func Mark(ctx context.Context, tx pgx.Tx) error {
	var exists bool
	if err := tx.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.quiesce') is not null`).Scan(&exists); err != nil {
		return fmt.Errorf("looking for %s: %w", StateTable, err)
	}
	if !exists {
		return nil
	}
	if _, err := tx.Exec(ctx, `update pgflow_upgrade.quiesce set phase = 'applied', updated_at = pg_catalog.now()`); err != nil {
		return fmt.Errorf("recording quiesce phase applied in %s: %w", StateTable, err)
	}
	return nil
}

// StatusInfo is what `status` shows of a quiesce in progress.
type StatusInfo struct {
	State
	Functions int    `json:"functions"`
	CronJobs  int    `json:"cron_jobs"`
	Next      string `json:"next"` // the command that finishes it
	Undo      string `json:"undo"` // the command that undoes it
}

// ReadInProgress reads a quiesce in progress (nil: none).
func ReadInProgress(ctx context.Context, q Querier) (*StatusInfo, error) {
	s, err := Load(ctx, q)
	if err != nil || s == nil {
		return nil, err
	}
	info := &StatusInfo{State: *s, Next: ResumeCommand(s.Mode), Undo: UndoCommand}
	info.Functions, info.CronJobs = s.Counts()
	return info, nil
}
