package quiesce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Querier is what the read-only parts query through (pgx.Tx, *pgx.Conn).
type Querier = session.Querier

// Tables of the recorded state (schema pgflow_upgrade).
const (
	StateTable = "pgflow_upgrade.quiesce"
	ItemsTable = "pgflow_upgrade.quiesce_items"
)

// Phase of a recorded quiesce.
type Phase string

const (
	PhasePaused     Phase = "paused"     // functions disabled, crons paused, values recorded
	PhaseDeprecated Phase = "deprecated" // live 0.16.0 workers deprecated
	PhaseDrained    Phase = "drained"    // no task started by a live worker
	PhaseApplied    Phase = "applied"    // the upgrade committed; only the restore is left
)

// Item kinds of pgflow_upgrade.quiesce_items.
const (
	KindFunction = "function" // name: function_name; recorded: enabled
	KindCronJob  = "cron_job" // name: jobid; label: jobname; recorded: active
)

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

// Item is one recorded value.
type Item struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Label    string `json:"label,omitempty"`
	Recorded bool   `json:"recorded"`
}

// State is a recorded quiesce.
type State struct {
	Phase             Phase     `json:"phase"`
	Mode              string    `json:"mode"`
	WorkersDeprecated int       `json:"workers_deprecated"`
	StartedAt         time.Time `json:"started_at"`
	UpdatedAt         time.Time `json:"updated_at"`
	Items             []Item    `json:"items"`
}

// Load reads the recorded quiesce; nil when there is none.
func Load(ctx context.Context, q Querier) (*State, error) {
	var exists bool
	if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.quiesce') is not null
	                              and pg_catalog.to_regclass('pgflow_upgrade.quiesce_items') is not null`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking for %s: %w", StateTable, err)
	}
	if !exists {
		return nil, nil
	}
	var s State
	err := q.QueryRow(ctx, `select phase, mode, workers_deprecated, started_at, updated_at from pgflow_upgrade.quiesce`).
		Scan(&s.Phase, &s.Mode, &s.WorkersDeprecated, &s.StartedAt, &s.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", StateTable, err)
	}
	rows, err := q.Query(ctx, `select kind, name, coalesce(label, ''), recorded from pgflow_upgrade.quiesce_items order by kind, name`)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", ItemsTable, err)
	}
	s.Items, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Item])
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", ItemsTable, err)
	}
	return &s, nil
}

// Find is Load for readers that may lack privileges on the tool's schema
// (an audit role): unreadable is true, and s nil, when the recorded state's
// tables exist but the current role cannot read them; s is nil when there
// is no recorded quiesce. The tables are looked up in pg_class, which every
// role can read.
func Find(ctx context.Context, q Querier) (s *State, unreadable bool, err error) {
	var n int
	var readable bool
	if err := q.QueryRow(ctx, `
		select pg_catalog.count(*)::int,
		       coalesce(pg_catalog.bool_and(pg_catalog.has_schema_privilege(n.oid, 'USAGE')
		                                    and pg_catalog.has_table_privilege(c.oid, 'SELECT')), false)
		  from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		 where n.nspname = 'pgflow_upgrade' and c.relname in ('quiesce', 'quiesce_items') and c.relkind in ('r', 'p')`).Scan(&n, &readable); err != nil {
		return nil, false, fmt.Errorf("looking for %s: %w", StateTable, err)
	}
	switch {
	case n < 2:
		return nil, false, nil
	case !readable:
		return nil, true, nil
	}
	s, err = Load(ctx, q)
	return s, false, err
}

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

// Status reads a quiesce in progress (nil: none).
func Status(ctx context.Context, q Querier) (*StatusInfo, error) {
	s, err := Load(ctx, q)
	if err != nil || s == nil {
		return nil, err
	}
	info := &StatusInfo{State: *s, Next: ResumeCommand(s.Mode), Undo: UndoCommand}
	info.Functions, info.CronJobs = s.Counts()
	return info, nil
}

// Counts: the recorded worker functions and cron jobs.
func (s *State) Counts() (functions, cronJobs int) {
	for _, it := range s.Items {
		if it.Kind == KindFunction {
			functions++
		} else {
			cronJobs++
		}
	}
	return functions, cronJobs
}

// UndoCommand restores a recorded quiesce without upgrading.
const UndoCommand = "pgflow-upgrade apply --undo-quiesce --yes"

// Modes: which apply started the quiesce (resume runs the same one).
const (
	ModeApply  = "apply"
	ModeOnline = "online"
)

// ResumeCommand is the command that finishes a quiesce of mode.
func ResumeCommand(mode string) string {
	if mode == ModeOnline {
		return "pgflow-upgrade apply --online --resume-quiesce --yes"
	}
	return "pgflow-upgrade apply --resume-quiesce --yes"
}
