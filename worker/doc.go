// Package worker runs the tasks of a pgflow flow as a first-class pgflow 0.17
// worker: the same calls, in the same order, with the same arguments and
// defaults as upstream's TypeScript worker, so a Go service can serve a flow
// beside TypeScript workers (docs/design.md "The worker").
//
// # Routes
//
// A flow's queue layout is its Flow.QueueMode, resolved locally by New with
// no database call (Flow.Routes):
//
//   - flow mode (the default, and every flow migrated from 0.16.0): every
//     step on one queue, lower(flow_slug); a worker serves every step;
//   - step mode: each step on its own queue, StepQueueName: the readable
//     lower(flow_slug||'__'||step_slug) when it fits pgmq's 47 characters,
//     else lower(flow_slug||'__'||step_index), and the flow is refused (a
//     *ConfigError) when even lower(flow_slug||'__0') is too long or the
//     fallback does not fit. Names are never truncated. A worker serves one
//     step (Config.StepSlug) and polls that step's queue.
//
// # Lifecycle
//
// New validates a Config (defaults filled in, problems reported as
// *ConfigError before anything touches the database). Start then runs, in
// this order:
//
//  1. pgflow.ensure_flow_compiled(slug, shape, queue_mode, route_map), four
//     positional arguments. The database compiles a missing flow, verifies an
//     existing one, or reports a mismatch: a *FlowShapeMismatchError or a
//     *FlowRoutingMismatchError (both errors.Is ErrFlowMismatch). A pgflow
//     0.16.0 database has no such function (SQLSTATE 42883): a
//     *ProtocolMismatchError (errors.Is ErrProtocolMismatch, the
//     *pgconn.PgError reachable). Either way nothing has been registered;
//  2. pgflow.track_worker_function(name, 'process'), or (name) for
//     StartModeHTTP;
//  3. an INSERT into pgflow.workers with the canonical route as queue_name
//     (and, on pgflow 0.17.1 and later, Config.PgflowVersion as pgflow_version);
//  4. a heartbeat every HeartbeatInterval (last_heartbeat_at =
//     clock_timestamp(), returning whether deprecated_at is set): a
//     deprecated worker stops polling and shuts down gracefully;
//  5. the poll loop.
//
// # Polling and running
//
// The poll loop waits for a free slot (and, while other handlers still run,
// up to ClaimLinger for more, so one poll serves several tasks; longer, within
// four recent write round trips, for slots that only outcome writes
// hold), then calls
// pgmq.read_with_poll on its route for min(BatchSize, free slots) messages
// and claims them with pgflow.start_tasks(flow_slug, msg_ids, worker_id,
// queue_name, step_slug), step_slug NULL in flow mode. Messages with no
// claimable task are logged (queue, ids, flow, step) and come back after
// VisibilityTimeout; a failed claim is logged, counted in Stats and the loop
// backs off.
//
// Each claimed task runs its step's HandlerFunc in its own goroutine. The
// run's input is on the claim for root single steps; Task.LoadFlowInput reads
// it from pgflow.runs for the others, only when a handler asks. Success calls
// pgflow.complete_task with the output as JSON; an error or a panic
// (recovered, the worker keeps running) calls pgflow.fail_task with the
// error's message, and the engine retries with its delays until max_attempts.
// Outcomes are written on a context no stop or cancel can cut off
// (context.WithoutCancel, bounded by WriteTimeout).
//
// # Stopping
//
// Stop(ctx) is graceful, in upstream's order: pgflow.mark_worker_stopped,
// stop polling (a poll in flight is cancelled; a claim in flight finishes
// and its tasks run), wait for in-flight handlers within ShutdownTimeout and
// write their outcomes. Handlers still running after it are cancelled; a
// task whose handler returns because of that gets no call at all (as
// upstream on an abort): it stays started until pgflow.requeue_stalled_tasks
// takes it back after its visibility timeout. Run(ctx) wraps Start and Stop
// for a main function driven by signal.NotifyContext.
//
// Cancelling the context given to Start is a hard stop, like a crash:
// handlers are cancelled and the worker is not marked stopped.
//
// Message ids are exact everywhere: int64 in Go and in every SQL parameter,
// strings in JSON.
package worker
