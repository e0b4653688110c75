// Package quiesce does upstream's manual stop-and-resume steps around the
// 0.16.0 -> 0.17.0 migration (docs/runbook.md step 5) for `apply
// --quiesce`, records what it changed, and undoes it exactly, also after a
// crash in the middle.
//
// The steps, each one committed transaction that also advances the recorded
// phase in the tool's own schema (pgflow_upgrade.quiesce and
// pgflow_upgrade.quiesce_items; never in pgflow, whose catalog must stay
// exactly upstream's):
//
//  1. Pause (phase "paused"): record every pgflow.worker_functions.enabled
//     value and the active flag of every pgflow cron job (upstream's
//     pgflow_ensure_workers, pgflow_cleanup_logs, pgflow_requeue_stalled_tasks
//     and any job whose command calls pgflow.*, e.g. a pruning job), then set
//     enabled = false and pause the jobs with cron.alter_job(job_id, active =>
//     false) — pg_cron's own API; cron.job is never updated directly.
//     Recording and disabling are one transaction: nothing is ever disabled
//     without its recorded value.
//  2. Deprecate (phase "deprecated"): set deprecated_at on every live
//     0.16.0 worker (not stopped, heartbeat within Options.LiveWorker), so it
//     stops polling at its next heartbeat.
//  3. WaitDrained (phase "drained"): poll, bounded by Options.DrainTimeout,
//     until no task is 'started' by a live worker and every live worker has
//     seen its deprecation (stopped, or heartbeat after deprecated_at);
//     workers that start meanwhile are deprecated too.
//  4. The caller's apply runs; its transaction marks the phase "applied"
//     (Mark), atomically with the migration.
//  5. Restore: in one transaction, every recorded cron flag (crons first),
//     then every recorded enabled value, exactly; the recorded state is
//     deleted with it.
//
// A failure or interruption at any point after step 1 restores (Run does it
// with a context that survives the cancel). A crash leaves the recorded
// state; ReadInProgress reports it, Run with Resume continues from its phase and
// Undo restores it. Producers outside the database (start_flow callers) are
// not something the database can pause: docs/runbook.md says how.
package quiesce
