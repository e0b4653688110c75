package audit

import (
	"context"
	"fmt"
)

// backupPgdumpPGMQ is backup.pgdump_pgmq.
var backupPgdumpPGMQ = Check{
	ID: "backup.pgdump_pgmq", Title: "backups include the queues", Severity: Warning, Runs: InAudit | UnderLocks,
	Needs: NeedsPGMQ,
	Meaning: "Below pgmq 1.6.0 the extension registers its queue tables as extension members without pg_extension_config_dump, so pg_dump leaves pgmq.meta, " +
		"every q_/a_ table and all their rows out. From 1.6.0 they are detached and pgmq.meta is marked for pg_dump, so pg_dump includes them, " +
		"except the tables of a queue listed in pgmq.meta under a mixed-case name (the 1.6.0 update detaches pgmq.\"q_<name>\" and misses them). " +
		"Read from pg_depend and pg_extension, per queue; nothing is reported without queues. Unlogged queues are also missing from physical backups and replicas.",
	Remedy: "Before apply take a physical backup or provider snapshot (pg_basebackup, PITR), or export the queue tables next to pg_dump " +
		"(\\copy (select * from pgmq.q_<queue>) to ...), and check that a restore brings the messages back.",
	Run: checkBackup,
}

func checkBackup(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var queues, members, unlogged int64
	var metaDumped bool
	var samples, unloggedSamples []map[string]any
	if err := q.QueryRow(ctx, backupSQL, env.Sample).Scan(&queues, &members, &metaDumped, &unlogged, &samples, &unloggedSamples); err != nil {
		return nil, fmt.Errorf("listing queues with pgmq.list_queues() and their extension membership from pg_depend: %w", err)
	}
	var out []Finding
	// What pg_dump leaves out is read from the catalog, not assumed from
	// the version: below 1.6.0 every queue's tables are extension members;
	// from 1.6.0 only those the 1.6.0 update could not detach (it detaches
	// pgmq."q_<pgmq.meta name>", which misses a mixed-case name).
	if env.PGMQ.Kind == "extension" && queues > 0 && (members > 0 || !metaDumped) {
		var msg string
		if members > 0 {
			msg = fmt.Sprintf("pg_dump leaves out the tables and messages of %d of %d queue(s) (pgmq %s: their tables are members of the extension)", members, queues, env.PGMQ.Version)
			if !metaDumped {
				msg += ", and pgmq.meta"
			}
		} else {
			msg = fmt.Sprintf("pg_dump leaves out pgmq.meta, the list of all %d queue(s) (pgmq %s does not mark it for pg_dump)", queues, env.PGMQ.Version)
		}
		out = append(out, c.finding(members, msg, samples))
	}
	if unlogged > 0 {
		f := c.finding(unlogged, fmt.Sprintf("%d unlogged queue(s): their messages are lost on a crash and absent from physical backups and replicas", unlogged), unloggedSamples)
		f.Remedy = "Export their messages before apply, or recreate them as logged queues when they are empty."
		out = append(out, f)
	}
	return out, nil
}
