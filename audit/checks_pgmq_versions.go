package audit

import (
	"context"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Mismatches lists the pgmq.meta rows pgmq's 1.9.0 → 1.10.0 update step
// fails on (pgmqver.MismatchedMetaSQL), all of them when limit < 0.
// apply --pgmq repairs the same list the audit reports.
func Mismatches(ctx context.Context, q Querier, limit int) ([]pgmqver.Mismatch, error) {
	var lim any
	if limit >= 0 {
		lim = limit
	}
	rows, err := q.Query(ctx, pgmqver.MismatchedMetaSQL, lim)
	if err != nil {
		return nil, fmt.Errorf("comparing pgmq.meta with the queue tables: %w", err)
	}
	defer rows.Close()
	var out []pgmqver.Mismatch
	for rows.Next() {
		var m pgmqver.Mismatch
		if err := rows.Scan(&m.Name, &m.Table, &m.TableExists, &m.LowerListed); err != nil {
			return nil, fmt.Errorf("comparing pgmq.meta with the queue tables: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("comparing pgmq.meta with the queue tables: %w", err)
	}
	return out, nil
}

// pgmqClaimPath is pgmq.claim_path.
var pgmqClaimPath = Check{
	ID: "pgmq.claim_path", Title: "pgmq's read, pop and set_vt work on every queue", Severity: Blocker, Runs: InAudit | UnderLocks,
	Needs: NeedsPGMQ,
	Meaning: "pgmq 1.10.0 and 1.10.1 add last_read_at to every queue table (last, on the queues that existed) and recreate pgmq.message_record " +
		"with it in fourth place, while read, pop and set_vt still return the table's row as that type: on every queue created before 1.10.0 " +
		"they fail (42804; read_with_poll 22007), so no worker can claim a task. 1.11.0 rewrites them. Read from pg_attribute: the queue " +
		"tables whose columns, in order, are not message_record's.",
	Remedy: "Update pgmq past 1.10: `pgflow-upgrade apply --pgmq 1.13.1` (or ALTER EXTENSION pgmq UPDATE TO '1.11.0' or later, in a quiet moment: " +
		"it locks every queue table). Never stop at 1.10.0 or 1.10.1.",
	Run: checkClaimPath,
}

func checkClaimPath(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	v, err := pgmqver.Parse(env.PGMQ.Version)
	if env.PGMQ.Kind != "extension" || err != nil || !pgmqver.BreaksClaim(v) {
		return nil, nil
	}
	var n int64
	var names []string
	if err := q.QueryRow(ctx, pgmqver.StaleClaimTablesSQL, env.Sample).Scan(&n, &names); err != nil {
		return nil, fmt.Errorf("comparing the queue tables' columns with pgmq.message_record: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	var samples []map[string]any
	for _, name := range names {
		samples = append(samples, map[string]any{"queue": name})
	}
	return []Finding{c.finding(n, fmt.Sprintf("pgmq %s: read, pop and set_vt fail (42804) on %d queue(s) created before 1.10.0: no worker can claim from them", env.PGMQ.Version, n), samples)}, nil
}

// pgmqUpdatePath is pgmq.update_path.
var pgmqUpdatePath = Check{
	ID: "pgmq.update_path", Title: "the update to the newest pgmq the server offers", Severity: Warning, Runs: InAudit,
	Needs: NeedsPGMQ,
	Meaning: "Whether ALTER EXTENSION pgmq UPDATE to the newest version in pg_available_extension_versions would go through, and what it locks. " +
		"pgmq's 1.9.0 → 1.10.0 step alters pgmq.\"q_<name>\" for each pgmq.meta name as listed, while pgmq creates every queue table as " +
		"q_<lower(name)>: a queue listed under a mixed-case name (pgflow 0.16.0 lists a flow's queue under its slug as given, e.g. upstream's " +
		"example flow analyzeWebsite) makes the whole update fail (42P01) and leaves pgmq where it was; the 1.6.0 step also leaves that queue's tables " +
		"extension members. The update takes ACCESS EXCLUSIVE on every queue and archive table until it commits. Read from pgmq.meta and pg_class.",
	Remedy: "`pgflow-upgrade apply --pgmq VERSION` renames such pgmq.meta rows to their tables' lower-case names in the same transaction as the update " +
		"(pgflow 0.17 finds its queues case-insensitively, pgmq's functions lower every name), under bounded locks; see the runbook, \"The pgmq hop\".",
	Run: checkUpdatePath,
}

func checkUpdatePath(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	p := env.PGMQ
	info := func(msg string) []Finding {
		f := c.finding(0, msg, nil)
		f.Severity, f.Remedy = Info, "None."
		return []Finding{f}
	}
	if p.Kind != "extension" {
		return info("pgmq is " + p.String() + ": its updates are not ALTER EXTENSION and are not checked"), nil
	}
	cur, err1 := pgmqver.Parse(p.Version)
	newest, err2 := pgmqver.Parse(p.Newest)
	if err1 != nil || err2 != nil {
		return info(fmt.Sprintf("pgmq extension %q, newest offered %q: not versions this check reads", p.Version, p.Newest)), nil
	}
	if !cur.Less(newest) {
		return info(fmt.Sprintf("pgmq %s is the newest version this server offers (pg_available_extension_versions)", p.Version)), nil
	}
	var queues int64
	if err := q.QueryRow(ctx, `select pg_catalog.count(*) from pgmq.meta`).Scan(&queues); err != nil {
		return nil, fmt.Errorf("counting pgmq.meta: %w", err)
	}
	locks := fmt.Sprintf("the update takes ACCESS EXCLUSIVE on pgmq.meta and the %d queue and %d archive table(s) until it commits "+
		"(it waits behind any open transaction on a queue, and every worker of every queue waits behind it)", queues, queues)
	if env.Schema.State == versions.SchemaBaseline {
		locks += "; the pgflow hop (apply) locks pgflow.flows, steps and step_tasks ACCESS EXCLUSIVE and the other pgflow tables EXCLUSIVE"
	}
	if !pgmqver.CrossesLastReadAt(cur, newest) {
		return info(fmt.Sprintf("the update to pgmq %s would go through; %s", p.Newest, locks)), nil
	}
	mism, err := Mismatches(ctx, q, -1)
	if err != nil {
		return nil, err
	}
	if len(mism) == 0 {
		msg := fmt.Sprintf("the update to pgmq %s would go through; %s", p.Newest, locks)
		if pgmqver.BreaksClaim(newest) {
			f := c.finding(0, fmt.Sprintf("the newest pgmq this server offers is %s, which breaks read, pop and set_vt on existing queues (see pgmq.claim_path); %s", p.Newest, locks), nil)
			return []Finding{f}, nil
		}
		return info(msg), nil
	}
	var samples []map[string]any
	var damaged []string
	for _, m := range mism {
		if len(samples) < env.Sample {
			samples = append(samples, map[string]any{"queue": m.Name, "table": "pgmq." + m.Table, "table_exists": m.TableExists, "lower_case_listed_too": m.LowerListed})
		}
		if !m.Repairable() {
			damaged = append(damaged, m.Name)
		}
	}
	msg := fmt.Sprintf("ALTER EXTENSION pgmq UPDATE TO '%s' would fail here (42P01 in the 1.9.0 → 1.10.0 step, nothing changed): %d queue(s) listed in pgmq.meta "+
		"under a name whose table pgmq.\"q_<name>\" does not exist (first: pgmq.\"q_%s\"; its table is pgmq.%s)", p.Newest, len(mism), mism[0].Name, mism[0].Table)
	if cur.Less(pgmqver.Detached) {
		msg += "; the 1.6.0 step would also leave their tables extension members (pg_dump leaves them out)"
	}
	msg += "; " + locks
	f := c.finding(int64(len(mism)), msg, samples)
	if len(damaged) > 0 {
		f.Remedy = "The tables of " + strings.Join(damaged, ", ") + " are missing (see pgmq.queue_physical): recreate or drop those queues first. " + f.Remedy
	}
	return []Finding{f}, nil
}
