// Package online is `pgflow-upgrade apply --online` (docs/online.md): the
// 0.16.0 → 0.17.0 upgrade of internal/upgrade, done so that the application
// (0.16.0 workers, start_flow, dashboards) is never blocked for more than a
// moment, however large pgflow.step_tasks is:
//
//  1. expand: one short transaction adds steps.queue_name and
//     step_tasks.queue_name nullable (catalog only) and a temporary BEFORE
//     INSERT OR UPDATE trigger on both that fills queue_name =
//     lower(flow_slug) in the rows the 0.16.0 engine inserts, or updates
//     while unfilled (wherever their new version lands); the progress table
//     pgflow_upgrade.online_progress records where the backfill is;
//  2. backfill: steps in one short statement, step_tasks by physical
//     position, in runs of blocks (TID range scans) of bounded size and time
//     (SKIP LOCKED), each its own short transaction that records the next
//     block, so a killed run continues where it stopped; throttled, and
//     waiting while replicas lag;
//  3. contract: pgflow.is_valid_queue_name (the migration file's own
//     statement), on both tables CHECK queue_name_is_valid (0.17.0's) and the
//     temporary CHECK queue_name_online_check (NOT NULL and = lower(flow_slug))
//     NOT VALID, then VALIDATE (SHARE UPDATE EXCLUSIVE: the application goes
//     on), then the three unique indexes of 0.17.0 CONCURRENTLY, with the
//     migration file's own definitions. The duplicate (queue, message id)
//     question is answered by that build, not by a scan before anything
//     starts: a build that fails (23505) drops its invalid index, reports the
//     rows (the audit check, run then) and rolls the online upgrade back;
//  4. switch: internal/upgrade.Apply, the transactional apply, on the
//     prepared shape: the same advisory lock, ordered table locks, preflight
//     under those locks, the migration file (its guard A1b recognises the
//     prepared shape; it then only sets NOT NULL, proven by the validated
//     check without a scan, reuses the valid indexes, drops the temporary
//     check and trigger, replaces the functions), post-conditions (the
//     catalog is upstream's 0.17.0) and the fence, in one short transaction
//     that also drops the online bookkeeping;
//  5. Rollback undoes an unfinished online upgrade back to 0.16.0.
//
// Every step looks at the catalog first and does only what is missing, so
// Upgrade run again after any interruption continues the upgrade.
package online

import (
	"context"
	"errors"
	"slices"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions/onlineshape"
)

// Names of what the online upgrade adds before the switch (package onlineshape
// reads them from the catalog; the version detection reads the same).
const (
	Schema         = versions.ToolSchema
	ProgressTable  = onlineshape.ProgressTable
	TriggerName    = onlineshape.TriggerName
	TriggerFunc    = onlineshape.TriggerFunc
	OnlineCheck    = onlineshape.OnlineCheck
	ValidCheck     = onlineshape.ValidCheck
	onlineCheckDef = onlineshape.OnlineCheckDef
	validCheckDef  = onlineshape.ValidCheckDef
)

// Index is one of 0.17.0's unique indexes, built CONCURRENTLY in contract.
type Index = onlineshape.Index

// Indexes in the order contract builds them.
var Indexes = onlineshape.Indexes

// Tables gets queue_name in expand, in the documented lock order.
var Tables = onlineshape.Tables

// OnlineLockKey is the session-level advisory lock an online run holds for
// its whole length (a second run, or a rollback, exits cleanly). Each of its
// DDL transactions also takes upgrade.AdvisoryLockKey, so the transactional
// apply never interleaves with them.
const OnlineLockKey = upgrade.AdvisoryLockKey + 1

// ErrBusy: another online run (or rollback) holds OnlineLockKey.
var ErrBusy = errors.New("another pgflow-upgrade apply --online (or rollback-online) is running on this database")

// Phase of an online upgrade.
type Phase = onlineshape.Phase

const (
	PhaseNone     = onlineshape.PhaseNone     // nothing of the online upgrade is there
	PhaseExpand   = onlineshape.PhaseExpand   // expanding
	PhaseBackfill = onlineshape.PhaseBackfill // columns and triggers there; rows being filled
	PhaseContract = onlineshape.PhaseContract // backfill done; checks, validate, indexes
	PhaseSwitch   = onlineshape.PhaseSwitch   // prepared: the switch transaction is next
	PhaseDone     = onlineshape.PhaseDone     // upgraded (flows.queue_mode exists)
)

// Querier is a connection or a transaction.
type Querier = session.Querier

// Shape is what the catalog says about the online upgrade's objects.
type Shape = onlineshape.Shape

// ReadShape reads the Shape from the catalog (no lock on a pgflow table).
func ReadShape(ctx context.Context, q Querier) (Shape, error) { return onlineshape.Read(ctx, q) }

func contains(list []string, s string) bool { return slices.Contains(list, s) }
