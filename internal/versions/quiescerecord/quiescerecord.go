// Package quiescerecord reads the record an `apply --quiesce` keeps in the
// tool's own schema (pgflow_upgrade.quiesce and pgflow_upgrade.quiesce_items):
// its phase and the values it recorded before it disabled worker functions
// and paused cron jobs. It is read-only and imports only internal/session, so
// the version detection (internal/versions) can name an open quiesce for
// every command without depending on internal/quiesce, which writes the
// record.
package quiescerecord

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Querier is what the record is read through (pgx.Tx, *pgx.Conn).
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
