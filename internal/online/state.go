// Package online is `pgflow-upgrade apply --online` (docs/online.md): the
// queue-persistence upgrade of internal/upgrade, done so that the
// application (0.16.0 workers, start_flow, dashboards) is never blocked for
// more than a moment, however large pgflow.step_tasks is:
//
//  1. expand: one short transaction adds step_tasks.queue_name nullable
//     (catalog only), a BEFORE INSERT trigger that fills it for the rows the
//     0.16.0 code keeps inserting, and the progress table
//     pgflow_upgrade.online_progress;
//  2. backfill: key-ordered batches of bounded size and time, each its own
//     short transaction that records how far it got, so a killed run
//     continues where it stopped; throttled, and waiting while replicas lag;
//  3. contract: CHECK (queue_name is not null and queue_name = flow_slug)
//     NOT VALID (a short lock), VALIDATE (SHARE UPDATE EXCLUSIVE: the
//     application goes on), the unique address index CONCURRENTLY;
//  4. switch: internal/upgrade.Apply, the transactional apply, on the
//     prepared shape: the same advisory lock, ordered table locks, preflight
//     under those locks, the migration file (which then only flips SET NOT
//     NULL, proven from the validated check without a scan, and drops the
//     check and the trigger), post-conditions, and the fence, in one short
//     transaction;
//  5. Rollback undoes an unfinished online upgrade back to 0.16.0.
//
// Every step looks at the catalog first and does only what is missing, so
// Apply run again after any interruption continues the upgrade.
package online

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// Names of what the online upgrade adds before the switch. The migration
// file knows CheckName, IndexName and TriggerName (its guard accepts the
// shape they make, and its part 5 drops the check and the trigger).
const (
	Schema        = "pgflow_upgrade"
	ProgressTable = "pgflow_upgrade.online_progress"
	CheckName     = "step_tasks_queue_name_online_check"
	IndexName     = "step_tasks_queue_name_message_id_key"
	TriggerName   = "pgflow_upgrade_queue_name"
	// checkDef is the check as pg_get_constraintdef prints it once it is
	// validated; before VALIDATE it prints checkDef + " NOT VALID".
	checkDef = "CHECK (((queue_name IS NOT NULL) AND (queue_name = flow_slug)))"
)

// OnlineLockKey is the session-level advisory lock an online run holds for
// its whole length (a second run, or a rollback, exits cleanly). Each of its
// DDL transactions also takes upgrade.AdvisoryLockKey, so the transactional
// apply never interleaves with them.
const OnlineLockKey = upgrade.AdvisoryLockKey + 1

// ErrBusy: another online run (or rollback) holds OnlineLockKey.
var ErrBusy = errors.New("another pgflow-upgrade apply --online (or rollback-online) is running on this database")

// Phase of an online upgrade.
type Phase string

const (
	PhaseNone     Phase = "none"     // nothing of the online upgrade is there
	PhaseExpand   Phase = "expand"   // expanding
	PhaseBackfill Phase = "backfill" // column and trigger there; rows being filled
	PhaseContract Phase = "contract" // backfill done; check, validate, index
	PhaseSwitch   Phase = "switch"   // prepared: the switch transaction is next
	PhaseDone     Phase = "done"     // upgraded
)

// Querier is a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Shape is what the catalog says about the online upgrade's objects.
type Shape struct {
	Pgflow        bool `json:"pgflow"`          // pgflow.step_tasks exists
	Upgraded      bool `json:"upgraded"`        // pgflow.schema_revisions exists (the switch happened)
	FlowsColumn   bool `json:"flows_column"`    // pgflow.flows.queue_name exists
	Column        bool `json:"column"`          // pgflow.step_tasks.queue_name exists
	ColumnNotNull bool `json:"column_not_null"` // ... and is NOT NULL
	ColumnText    bool `json:"column_text"`     // ... and is text
	Trigger       bool `json:"trigger"`         // the insert trigger exists
	Check         bool `json:"check"`           // the check exists (with the expected definition, validated or not)
	CheckForeign  bool `json:"check_foreign"`   // a constraint has the check's name but another definition
	CheckValid    bool `json:"check_valid"`     // ... and is validated
	Index         bool `json:"index"`           // the address index exists
	IndexValid    bool `json:"index_valid"`     // ... and is valid (not a leftover of a crashed CONCURRENTLY)
	Progress      bool `json:"progress"`        // pgflow_upgrade.online_progress exists
}

// Prepared: the shape the migration file accepts as an online-prepared
// 0.16.0 (its guard 1 checks the same).
func (s Shape) Prepared() bool {
	return s.Pgflow && !s.Upgraded && !s.FlowsColumn && s.Column && s.ColumnText && !s.ColumnNotNull &&
		s.Check && s.CheckValid && s.Index && s.IndexValid
}

// Started: something of the online upgrade is there (and the switch has not happened).
func (s Shape) Started() bool {
	return !s.Upgraded && (s.Column || s.Trigger || s.Check || s.Index || s.Progress)
}

// Phase derives where an online upgrade stands from the catalog.
func (s Shape) Phase() Phase {
	switch {
	case s.Upgraded:
		return PhaseDone
	case s.Prepared():
		return PhaseSwitch
	case s.Check || s.Index:
		return PhaseContract
	case s.Column:
		return PhaseBackfill
	case s.Progress:
		return PhaseExpand
	}
	return PhaseNone
}

// Detect reads the Shape from the catalog (no lock on a pgflow table).
func Detect(ctx context.Context, q Querier) (Shape, error) {
	var s Shape
	err := q.QueryRow(ctx, `
		with st as (select pg_catalog.to_regclass('pgflow.step_tasks') as oid),
		     col as (select a.attnotnull, a.atttypid from pg_catalog.pg_attribute a, st
		             where a.attrelid = st.oid and a.attname = 'queue_name' and not a.attisdropped),
		     named as (select c.oid, c.contype, c.convalidated from pg_catalog.pg_constraint c, st
		               where c.conrelid = st.oid and c.conname = $1),
		     chk as (select n.convalidated from named n
		             where n.contype = 'c'
		               and pg_catalog.pg_get_constraintdef(n.oid) in ($2, $2 || ' NOT VALID')),
		     idx as (select i.indisvalid, i.indisunique from pg_catalog.pg_index i, st
		             where i.indrelid = st.oid and i.indexrelid = pg_catalog.to_regclass('pgflow.' || $3))
		select (select oid from st) is not null,
		       pg_catalog.to_regclass('pgflow.schema_revisions') is not null,
		       exists (select 1 from pg_catalog.pg_attribute a
		               where a.attrelid = pg_catalog.to_regclass('pgflow.flows') and a.attname = 'queue_name' and not a.attisdropped),
		       exists (select 1 from col),
		       coalesce((select attnotnull from col), false),
		       coalesce((select atttypid = 'pg_catalog.text'::pg_catalog.regtype from col), false),
		       exists (select 1 from pg_catalog.pg_trigger t, st where t.tgrelid = st.oid and t.tgname = $4 and not t.tgisinternal),
		       exists (select 1 from chk),
		       exists (select 1 from named) and not exists (select 1 from chk),
		       coalesce((select convalidated from chk), false),
		       exists (select 1 from idx),
		       coalesce((select indisvalid and indisunique from idx), false),
		       pg_catalog.to_regclass($5) is not null`,
		CheckName, checkDef, IndexName, TriggerName, ProgressTable).Scan(
		&s.Pgflow, &s.Upgraded, &s.FlowsColumn, &s.Column, &s.ColumnNotNull, &s.ColumnText,
		&s.Trigger, &s.Check, &s.CheckForeign, &s.CheckValid, &s.Index, &s.IndexValid, &s.Progress)
	if err != nil {
		return s, fmt.Errorf("online: reading the catalog: %w", err)
	}
	return s, nil
}

// dropOwnObjects removes what the online upgrade made in schema
// pgflow_upgrade (its progress table and trigger function, with the
// trigger), and the schema itself only when nothing else is in it: the
// tool's revision record (pgflow_upgrade.schema_revisions) lives there too.
const dropOwnObjects = `
drop table if exists pgflow_upgrade.online_progress;
drop function if exists pgflow_upgrade.step_tasks_queue_name() cascade;
do $drop$
begin
  if pg_catalog.to_regnamespace('pgflow_upgrade') is not null
     and not exists (select 1 from pg_catalog.pg_class c where c.relnamespace = pg_catalog.to_regnamespace('pgflow_upgrade'))
     and not exists (select 1 from pg_catalog.pg_proc p where p.pronamespace = pg_catalog.to_regnamespace('pgflow_upgrade')) then
    drop schema pgflow_upgrade;
  end if;
end
$drop$`

// Progress is the row of pgflow_upgrade.online_progress.
type Progress struct {
	Phase string `json:"phase"`
	// The last key the backfill finished (primary key order); nil: from the start.
	LastRunID     *string   `json:"last_run_id"`
	LastStepSlug  *string   `json:"last_step_slug"`
	LastTaskIndex *int32    `json:"last_task_index"`
	Pass          int32     `json:"pass"`       // backfill pass (a second pass revisits rows skipped as locked)
	RowsDone      int64     `json:"rows_done"`  // rows the backfill has filled so far
	RowsTotal     int64     `json:"rows_total"` // step_tasks rows when the backfill started (estimate)
	Batches       int64     `json:"batches"`
	Rate          float64   `json:"rate"` // rows/s of the most recent run
	StartedAt     time.Time `json:"started_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// RowsLeft is an estimate (the total is pg_class.reltuples at the start).
func (p Progress) RowsLeft() int64 {
	if p.RowsTotal <= p.RowsDone {
		return 0
	}
	return p.RowsTotal - p.RowsDone
}

// progressDDL creates our schema, the progress table and the trigger
// function. Idempotent; touches no pgflow table.
const progressDDL = `
create schema if not exists pgflow_upgrade;
create table if not exists pgflow_upgrade.online_progress (
  id              boolean primary key default true check (id), -- one row
  phase           text not null,
  last_run_id     uuid,
  last_step_slug  text,
  last_task_index integer,
  pass            integer not null default 1,
  rows_done       bigint not null default 0,
  rows_total      bigint not null default 0,
  batches         bigint not null default 0,
  rate            double precision not null default 0,
  started_at      timestamptz not null default pg_catalog.now(),
  updated_at      timestamptz not null default pg_catalog.now()
);
-- New tasks written by the 0.16.0 code while the online upgrade runs: their
-- queue is their flow's slug (the naming rule). Inserts only: step_tasks
-- updates are the hot path and get no trigger.
create or replace function pgflow_upgrade.step_tasks_queue_name()
returns trigger
language plpgsql
set search_path = ''
as $$
begin
  new.queue_name := new.flow_slug;
  return new;
end
$$;`

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
		select phase, last_run_id::text, last_step_slug, last_task_index, pass, rows_done, rows_total, batches, rate, started_at, updated_at
		from pgflow_upgrade.online_progress where id`).Scan(
		&p.Phase, &p.LastRunID, &p.LastStepSlug, &p.LastTaskIndex, &p.Pass, &p.RowsDone, &p.RowsTotal, &p.Batches, &p.Rate, &p.StartedAt, &p.UpdatedAt)
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

// StatusInfo is what `status` shows of an online upgrade.
type StatusInfo struct {
	Phase    Phase     `json:"phase"`
	Shape    Shape     `json:"shape"`
	Progress *Progress `json:"progress,omitempty"`
	RowsLeft int64     `json:"rows_left"`
	// ETASeconds: rows left at the last recorded rate (0 when unknown).
	ETASeconds float64 `json:"eta_seconds"`
}

// Status reads the online upgrade's state (catalog and the progress row)
// through q, e.g. status's READ ONLY transaction.
func Status(ctx context.Context, q Querier) (*StatusInfo, error) {
	s, err := Detect(ctx, q)
	if err != nil {
		return nil, err
	}
	info := &StatusInfo{Phase: s.Phase(), Shape: s}
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
