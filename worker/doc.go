// Package worker runs the tasks of a pgflow flow on the queue-aware protocol
// that the pgflow_persist_queue upgrade installs (SPEC §5, docs/design.md
// "The new protocol").
//
// # Lifecycle
//
// New validates a Config (defaults filled in, problems reported as
// *ConfigError before anything touches the database). Start then runs, in
// this order:
//
//  1. the startup fence, CheckProtocol: select pgflow.queue_protocol_version()
//     and check that every function the worker calls exists. A pgflow 0.16.0
//     database fails here with a *ProtocolMismatchError (errors.Is
//     ErrProtocolMismatch; the *pgconn.PgError stays reachable), before the
//     worker has written anything;
//  2. EnsureFlow: pgflow.ensure_flow_compiled(slug, shape, false) creates the
//     flow and its queue, or checks the existing shape (a different one is a
//     *FlowMismatchError; data is never dropped);
//  3. registration in pgflow.workers;
//  4. a heartbeat every HeartbeatInterval, which also notices
//     pgflow.workers.deprecated_at: a deprecated worker stops claiming and
//     shuts down gracefully;
//  5. the claim loop.
//
// # Claiming and running
//
// The claim loop waits for a free slot (and, while other handlers still run,
// up to ClaimLinger for more, so that one claim serves several tasks), then
// calls pgflow.claim_tasks for as many tasks as there are free slots (at most
// BatchSize), so nothing is claimed that cannot start at once. Results are typed: ClaimedTask, or
// FatalClaimError for a message claim_tasks refused (no task, wrong flow,
// different work). Fatal messages are logged with their address (queue_name,
// message_id), counted in Stats and passed to Config.OnFatal; they stay in
// their queue for an operator.
//
// Each claimed task runs its step's HandlerFunc in its own goroutine with the
// task's input, the flow input, run id, step slug, task index and attempt.
// Success calls pgflow.complete_task with the output as JSON; an error or a
// panic (recovered, the worker keeps running) calls pgflow.fail_task, and the
// engine retries with its delays (floor(base_delay * 2^attempts)) until
// max_attempts, then applies when_exhausted. Outcomes are written on a
// context that no stop or cancel can cut off (context.WithoutCancel, bounded
// by WriteTimeout), so finished work is never lost to a shutdown.
//
// # Stopping
//
// Stop(ctx) is graceful: it stops claiming (a claim in flight is allowed to
// return, so nothing it claimed is stranded), lets running handlers finish
// within ShutdownTimeout, then cancels their contexts and releases their
// tasks with pgflow.release_task (queued again at once, no attempt used),
// and finally calls pgflow.mark_worker_stopped. Run(ctx) wraps Start and
// Stop for a main function driven by signal.NotifyContext.
//
// Cancelling the context given to Start is a hard stop, like a crash:
// handlers are cancelled, nothing is released and the worker is not marked
// stopped; its unfinished tasks become claimable by other workers when their
// visibility timeout passes.
//
// Message ids are exact everywhere: int64 in Go, strings in JSON.
package worker
