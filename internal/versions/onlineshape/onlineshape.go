// Package onlineshape reads, from the catalog alone, how far an `apply
// --online` of this tool has got: which of its objects exist (the nullable
// queue_name columns, the fill triggers, pgflow.is_valid_queue_name, the
// temporary and the 0.17.0 checks, the unique indexes, the progress table)
// and so its phase. It imports only internal/session and lives under
// internal/versions, so the version detection can name an online upgrade in
// progress for every command without depending on internal/online, which
// drives its phases from the same reading.
package onlineshape

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Names of what the online upgrade adds before the switch. The migration
// file knows TriggerName, OnlineCheck and the 0.17.0 names (its guard A1b
// accepts the shape they make; B3/B4 drop the temporary ones).
const (
	ToolSchema    = "pgflow_upgrade"
	ProgressTable = "pgflow_upgrade.online_progress"
	TriggerName   = "pgflow_upgrade_online_queue_name"
	TriggerFunc   = "pgflow_upgrade.online_fill_queue_name"
	// OnlineCheck proves, once validated, that queue_name is set on every
	// row (so the switch's SET NOT NULL reads no row) and is lower(flow_slug).
	OnlineCheck = "queue_name_online_check"
	ValidCheck  = "queue_name_is_valid" // 0.17.0's
	// OnlineCheckDef and ValidCheckDef: as pg_get_constraintdef prints them
	// with search_path pg_catalog once validated.
	OnlineCheckDef = "CHECK (((queue_name IS NOT NULL) AND (queue_name = lower(flow_slug))))"
	ValidCheckDef  = "CHECK (pgflow.is_valid_queue_name(queue_name))"
)

// Index is one of 0.17.0's unique indexes, built CONCURRENTLY in contract.
type Index struct {
	Name, Table string
	// Check is the audit check that lists the rows a failed build stumbled on.
	Check string
}

// Indexes in the order contract builds them.
var Indexes = []Index{
	{"idx_flows_normalized_slug", "flows", "flows.case_alias"},
	{"idx_steps_normalized_slug", "steps", "steps.case_alias"},
	{"idx_step_tasks_queue_message", "step_tasks", "tasks.duplicate_message_id"},
}

// Tables gets queue_name in expand, in the documented lock order.
var Tables = []string{"steps", "step_tasks"}

// Phase of an online upgrade.
type Phase string

const (
	PhaseNone     Phase = "none"     // nothing of the online upgrade is there
	PhaseExpand   Phase = "expand"   // expanding
	PhaseBackfill Phase = "backfill" // columns and triggers there; rows being filled
	PhaseContract Phase = "contract" // backfill done; checks, validate, indexes
	PhaseSwitch   Phase = "switch"   // prepared: the switch transaction is next
	PhaseDone     Phase = "done"     // upgraded (flows.queue_mode exists)
)

// Querier is a connection or a transaction.
type Querier = session.Querier

// Shape is what the catalog says about the online upgrade's objects.
type Shape struct {
	Pgflow   bool `json:"pgflow"`   // pgflow.steps and pgflow.step_tasks exist
	Upgraded bool `json:"upgraded"` // pgflow.flows.queue_mode exists: the switch happened (or 0.17 some other way)
	// Columns: of steps.queue_name and step_tasks.queue_name, how many exist;
	// ColumnsOK: every one that exists is nullable text.
	Columns   int  `json:"columns"`
	ColumnsOK bool `json:"columns_ok"`
	Triggers  int  `json:"triggers"` // our triggers by name (0..2)
	// TriggersFull: of those, the ones firing on INSERT and on UPDATE (an
	// earlier pgflow-upgrade made insert-only ones; expand replaces them).
	TriggersFull int  `json:"triggers_full"`
	Function     bool `json:"function"` // pgflow.is_valid_queue_name(text)
	// Checks: of the four (two per table) with the expected definition,
	// how many exist and how many are validated.
	Checks      int `json:"checks"`
	ChecksValid int `json:"checks_valid"`
	// CheckForeign: a constraint has one of the checks' names but another definition.
	CheckForeign bool `json:"check_foreign"`
	// Indexes: of the three unique indexes, present and valid ones by name.
	Indexes      []string `json:"indexes"`
	IndexesValid []string `json:"indexes_valid"`
	Progress     bool     `json:"progress"` // pgflow_upgrade.online_progress exists
}

// Prepared: the shape the migration file's guard A1b accepts as an
// online-prepared 0.16.0.
func (s Shape) Prepared() bool {
	return s.Pgflow && !s.Upgraded && s.Columns == 2 && s.ColumnsOK && s.Function &&
		s.ChecksValid == 4 && !s.CheckForeign && len(s.IndexesValid) == len(Indexes)
}

// Started: something of the online upgrade is there (and the switch has not happened).
func (s Shape) Started() bool {
	return !s.Upgraded && (s.Columns > 0 || s.Triggers > 0 || s.Function || s.Checks > 0 || s.CheckForeign ||
		len(s.Indexes) > 0 || s.Progress)
}

// Phase derives where an online upgrade stands from the catalog.
func (s Shape) Phase() Phase {
	switch {
	case s.Upgraded:
		return PhaseDone
	case s.Prepared():
		return PhaseSwitch
	case s.Checks > 0 || s.CheckForeign || len(s.Indexes) > 0 || s.Function:
		return PhaseContract
	case s.Columns > 0 || s.Triggers > 0:
		return PhaseBackfill
	case s.Progress:
		return PhaseExpand
	}
	return PhaseNone
}

// InProgress: an online upgrade has begun and its switch has not happened.
func (s Shape) InProgress() bool {
	p := s.Phase()
	return p != PhaseNone && p != PhaseDone
}

// HasIndex / IndexValid answer for one of Indexes by name.
func (s Shape) HasIndex(name string) bool   { return slices.Contains(s.Indexes, name) }
func (s Shape) IndexValid(name string) bool { return slices.Contains(s.IndexesValid, name) }

// Read reads the Shape from the catalog: one query on pg_catalog, no lock
// on a pgflow table, and no privilege on schema pgflow or pgflow_upgrade
// needed (every object is looked up in pg_class and pg_proc by namespace,
// not through to_regclass, which needs USAGE on the schema).
// Definitions are compared as pg_get_constraintdef prints them, without the
// "pgflow." qualification (which depends on the caller's search_path).
func Read(ctx context.Context, q Querier) (Shape, error) {
	var s Shape
	names := make([]string, len(Indexes))
	for i, ix := range Indexes {
		names[i] = ix.Name
	}
	table, _ := strings.CutPrefix(ProgressTable, ToolSchema+".")
	err := q.QueryRow(ctx, `
		with t as (select c.oid, c.relname::text as relname from pg_catalog.pg_class c
		           where c.relnamespace = pg_catalog.to_regnamespace('pgflow') and c.relname in ('steps', 'step_tasks') and c.relkind in ('r', 'p')),
		     col as (select a.attnotnull, a.atttypid from pg_catalog.pg_attribute a join t on a.attrelid = t.oid
		             where a.attname = 'queue_name' and not a.attisdropped),
		     con as (select c.conname::text as conname, c.contype, c.convalidated,
		                    pg_catalog.replace(pg_catalog.regexp_replace(pg_catalog.pg_get_constraintdef(c.oid), ' NOT VALID$', ''), 'pgflow.', '') as def
		             from pg_catalog.pg_constraint c join t on c.conrelid = t.oid
		             where c.conname in ($1, $2)),
		     idx as (select ic.relname::text as name, i.indisvalid and i.indisready and i.indisunique as ok
		             from pg_catalog.pg_class ic join pg_catalog.pg_index i on i.indexrelid = ic.oid
		             where ic.relnamespace = pg_catalog.to_regnamespace('pgflow') and ic.relname = any($5::text[]))
		select (select pg_catalog.count(*) from t) = 2,
		       exists (select 1 from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid = a.attrelid
		               where c.relnamespace = pg_catalog.to_regnamespace('pgflow') and c.relname = 'flows' and c.relkind in ('r', 'p')
		                 and a.attname = 'queue_mode' and not a.attisdropped),
		       (select pg_catalog.count(*) from col)::int,
		       coalesce((select pg_catalog.bool_and(not attnotnull and atttypid = 'pg_catalog.text'::pg_catalog.regtype) from col), true),
		       (select pg_catalog.count(*) from pg_catalog.pg_trigger g join t on g.tgrelid = t.oid where g.tgname = $3 and not g.tgisinternal)::int,
		       (select pg_catalog.count(*) from pg_catalog.pg_trigger g join t on g.tgrelid = t.oid where g.tgname = $3 and not g.tgisinternal
		          and g.tgtype::int & 20 = 20)::int, -- TRIGGER_TYPE_INSERT (4) | TRIGGER_TYPE_UPDATE (16)
		       exists (select 1 from pg_catalog.pg_proc p
		               where p.pronamespace = pg_catalog.to_regnamespace('pgflow') and p.proname = 'is_valid_queue_name'
		                 and pg_catalog.oidvectortypes(p.proargtypes) = 'text'),
		       (select pg_catalog.count(*) from con where contype = 'c' and def = case conname when $1 then $6 else $7 end)::int,
		       (select pg_catalog.count(*) from con where contype = 'c' and def = case conname when $1 then $6 else $7 end and convalidated)::int,
		       exists (select 1 from con where contype <> 'c' or def <> case conname when $1 then $6 else $7 end),
		       coalesce((select pg_catalog.array_agg(name order by name) from idx), '{}'),
		       coalesce((select pg_catalog.array_agg(name order by name) from idx where ok), '{}'),
		       exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		               where n.nspname = $8 and c.relname = $4 and c.relkind in ('r', 'p'))`,
		OnlineCheck, ValidCheck, TriggerName, table, names, OnlineCheckDef, strings.ReplaceAll(ValidCheckDef, "pgflow.", ""), ToolSchema).Scan(
		&s.Pgflow, &s.Upgraded, &s.Columns, &s.ColumnsOK, &s.Triggers, &s.TriggersFull, &s.Function,
		&s.Checks, &s.ChecksValid, &s.CheckForeign, &s.Indexes, &s.IndexesValid, &s.Progress)
	if err != nil {
		return s, fmt.Errorf("reading the catalog for an online upgrade in progress: %w", err)
	}
	return s, nil
}
