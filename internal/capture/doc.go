// Package capture holds the capture file of a user's pgflow 0.16.0
// database: Write records the database (its schemas' DDL, rows, pgmq queues
// and messages, sequence positions, optionally redacted) as gzip-compressed
// JSON lines; Validate and Read check a file against Limits before anything
// is restored; Captured.Restore and RestoreFile rebuild it in an empty
// database. `pgflow-upgrade fixtures capture` writes it, `fixtures replay
// --from` and the rehearsal read and restore it (internal/cli,
// internal/scenario, upgrade_tests).
package capture
