// Package capture holds the capture file of a user's pgflow database, at
// any release an upgrade plan starts from (Header.Release, PlanStart):
// Write records the database (its schemas' DDL, rows, pgmq queues
// and messages, sequence positions, optionally redacted) as gzip-compressed
// JSON lines; Validate and Read check a file against Limits before anything
// is restored; Captured.Restore and RestoreFile rebuild it in an empty
// database. internal/cli (`fixtures capture`, `fixtures replay --from`) and
// upgrade_tests use it; fixtures/scenario's census and internal/rehearsal's
// digest list pgmq's queues with its QueueNames.
package capture
