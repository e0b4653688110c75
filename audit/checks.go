package audit

import (
	"context"
	"slices"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// allChecks is every check, in output order. IDs are stable: scripts and
// apply's output refer to them. The data checks name the 0.17.0 migration
// statement their finding would make fail (the migration runs in one
// transaction, so any of them fails it whole).
var allChecks = slices.Concat(
	installedChecks(),
	pgmqVersionChecks(),
	migrationBlockerChecks(),
	queueAndWorkerChecks(),
	sessionChecks(),
	sizeAndBackupChecks(),
	planChecks(),
	quiesceChecks(),
)

// installedChecks are what is installed: the pgflow version and schema
// state, and pgmq.
func installedChecks() []Check {
	return []Check{
		{
			ID: "schema.state", Title: "pgflow version and schema state", Severity: Blocker, Preflight: true,
			Meaning: "The live catalog is compared with every pgflow version this tool knows (internal/versions: 0.14.x, 0.15.x, 0.16.0, 0.17.0, 0.17.1+), " +
				"tolerating what users add (their own indexes, constraints, functions). 0.16.0 and 0.17.x are reported as info; an older version, " +
				"a schema no known version matches (the differences from the closest one named) or no pgflow schema is a blocker.",
			Remedy: "Older than 0.16.0: upgrade pgflow to 0.16.0 first with pgflow's own installer. Unknown: restore what differs from the closest " +
				"version (or restore from backup), then audit again. No pgflow schema: point --dsn at the right database.",
			Run: checkSchemaState,
		},
		{
			ID: "pgmq.installed", Title: "pgmq installed, version and functions", Severity: Blocker, Preflight: true,
			Meaning: "pgflow keeps every task's message in pgmq and calls pgmq's public functions. " +
				"Reports which pgmq is installed (extension and version, or a plain schema); a missing pgmq or missing functions block.",
			Remedy: "Install pgmq 1.5 or later (CREATE EXTENSION pgmq) in schema pgmq before upgrading pgflow.",
			Run:    checkPGMQInstalled,
		},
	}
}

// migrationBlockerChecks find the rows that would make a 0.17.0 migration
// statement fail, and with it the whole migration.
func migrationBlockerChecks() []Check {
	return []Check{
		{
			ID: "flows.case_alias", Title: "flows whose slugs differ only in case", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "0.17.0 creates a unique index on lower(flow_slug) (every flow's queue is lower(flow_slug)); the migration fails while two flows " +
				"differ only in case (MyFlow, myflow). Such flows already share one physical queue on 0.16.0 (pgmq names tables in lower case).",
			Remedy: "Keep one slug of each group: let the others' runs finish, then delete them (select pgflow.delete_flow_and_data('<slug>')) " +
				"and point their workers at the kept slug; audit again.",
			Run: checkCaseAlias,
		},
		{
			ID: "steps.case_alias", Title: "steps of one flow whose slugs differ only in case", Severity: Blocker, Preflight: true,
			Needs:   NeedsPgflow,
			Meaning: "0.17.0 creates a unique index on steps (flow_slug, lower(step_slug)); the migration fails while two steps of one flow differ only in case.",
			Remedy: "A flow's steps cannot be renamed in place: let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<flow>')) " +
				"and compile it again with step slugs that differ in more than case (the worker recompiles it at startup); audit again.",
			Run: checkStepCaseAlias,
		},
		{
			ID: "slugs.strict_rule", Title: "slugs that break 0.17.0's slug rule", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "0.17.0's is_valid_slug adds to 0.16.0's rule: the first character is a letter, the last a letter or digit, and no \"__\". " +
				"The migration re-adds flows.slug_is_valid and steps.steps_step_slug_check, which re-checks every existing flow and step slug; one bad slug fails it.",
			Remedy: "Slugs cannot be renamed in place: let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<flow>')), " +
				"rename the flow or step in the worker code to a valid slug (e.g. _import → import_, a__b → a_b) and let the worker compile it; audit again.",
			Run: checkSlugRule,
		},
		{
			ID: "flows.queue_name_too_long", Title: "queue names over pgmq's 47 characters", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "0.17.0 stores each step's and task's queue as lower(flow_slug) under CHECK is_valid_queue_name (at most 47 characters, pgmq's limit); " +
				"the migration fails on a flow whose slug is longer and has steps or tasks (a blocker). A longer-slug flow with neither does not stop it " +
				"(only steps and tasks get queue_name), but can never get steps under 0.17.0 (a warning).",
			Remedy: "Let the flow's runs finish, delete it (select pgflow.delete_flow_and_data('<slug>')) and compile it again under a slug of at most 47 characters; audit again.",
			Run:    checkQueueNameLength,
		},
		{
			ID: "tasks.duplicate_message_id", Title: "tasks sharing one (queue, message id)", Severity: Blocker, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "0.17.0 fills step_tasks.queue_name with lower(flow_slug) and creates a unique index on (queue_name, message_id) where message_id is not null; " +
				"the migration fails while two tasks share a pair (e.g. after a queue was dropped and recreated, restarting its ids). " +
				"Exact: every row with a message id is examined, in message-id ranges of --bound rows.",
			Remedy: "Decide which task owns the message; set message_id = null on finished tasks that no longer need it (or delete their old runs), then audit again.",
			Run:    checkDuplicateMessageID,
		},
	}
}

// queueAndWorkerChecks find queues and workers that do not stop the
// migration but break flows before or after it.
func queueAndWorkerChecks() []Check {
	return []Check{
		{
			ID: "pgmq.unowned_queue", Title: "listed queues no flow owns", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "A queue in pgmq.list_queues() whose lower-case name is no flow's lower(flow_slug). The migration leaves queues alone, but after it " +
				"create_flow refuses a new flow whose queue name is already listed (unique_violation) and a step-mode flow refuses a listed queue it does not own.",
			Remedy: "If the queue is a leftover of a deleted flow, drop it once its messages are not needed (select pgmq.drop_queue('<queue>')); " +
				"if it is your application's, keep it and never name a flow (or flow__step) after it.",
			Run: checkUnownedQueue,
		},
		{
			ID: "pgmq.queue_case_spellings", Title: "queues listed under more than one case spelling", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "pgmq names a queue's tables in lower case, so MyFlow and myflow listed together are one set of tables with two pgmq.meta rows. " +
				"The migration does not mind, but after it delete_flow_and_data raises ambiguous_alias for such a flow and step-mode routes refuse such a name.",
			Remedy: "Do not drop either spelling with pgmq.drop_queue: both name the same tables and their messages. Keep the spelling lower(flow_slug): " +
				"remove the other spelling's pgmq.meta row (delete from pgmq.meta where queue_name = '<spelling>') in a maintenance window, then audit again.",
			Run: checkQueueCaseSpellings,
		},
		{
			ID: "workers.legacy_alive", Title: "0.16.0 workers still alive", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow,
			Meaning: "Workers not stopped or deprecated with a recent heartbeat, on a 0.16.0 schema. A 0.16.0 worker still starts, registers and heartbeats on 0.17.0, " +
				"then fails at its first non-empty claim with 42883 (start_tasks(flow_slug, msg_ids, worker_id) no longer exists): it claims nothing and its messages " +
				"come back after their visibility timeout, so nothing is lost, but nothing runs either.",
			Remedy: "Stop them first (runbook, \"Stop the 0.16.0 workers\"): record and disable pgflow.worker_functions.enabled so ensure_workers does not restart them, " +
				"stop process workers and their supervisors, wait until no task is 'started', apply, then deploy 0.17.0 workers and restore enabled.",
			Run: checkLegacyWorkers,
		},
		{
			ID: "pgmq.flow_queue_missing", Title: "every flow has its queue", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "A flow's queue is lower(flow_slug) in any listed spelling (on 0.17.0: each step's stored queue_name, plus lower(flow_slug) in flow mode). " +
				"A flow without one has nowhere to put its tasks' messages: start_flow fails before and after the upgrade. The migration itself does not need it. " +
				"On 0.17.0 pgflow's delete_flow_and_data also fails for such a flow (pgmq 1.5.1's drop_queue raises 42P01) and changes nothing.",
			Remedy: "Create the missing queue (select pgmq.create('<queue>')); to remove the flow instead, create it first all the same, then " +
				"select pgflow.delete_flow_and_data('<slug>'); audit again.",
			Run: checkFlowQueueMissing,
		},
		{
			ID: "pgmq.queue_physical", Title: "flow queues have the tables pgflow needs", Severity: Warning, Preflight: true,
			Needs: NeedsPgflow | NeedsPGMQ,
			Meaning: "Each flow queue needs pgmq.q_<queue> and pgmq.a_<queue> with pgmq 1.5's columns and types, msg_id as primary key, " +
				"and msg_id an identity column on q_ (read from pg_class, pg_attribute and pg_index). A queue without them breaks sends, reads and archives " +
				"before and after the upgrade.",
			Remedy: "Recreate the damaged queue through pgmq once its messages are safe (export them, select pgmq.drop_queue('<queue>'), select pgmq.create('<queue>'), re-send), " +
				"or restore the table from backup; never ALTER pgmq's tables by hand.",
			Run: checkQueuePhysical,
		},
	}
}

// sessionChecks find the sessions that apply's table locks would wait
// behind.
func sessionChecks() []Check {
	return []Check{
		{
			ID: "sessions.long_transactions", Title: "long and idle-in-transaction sessions", Severity: Warning,
			Meaning: "Transactions open for more than 30 s, or idle in transaction for more than 10 s, in this database: apply's table locks wait behind their locks " +
				"and apply gives up after its lock timeout. Without pg_read_all_stats (or pg_monitor) other roles' sessions are invisible; that is reported as info.",
			Remedy: "Finish or terminate them (select pg_terminate_backend(pid)) before apply; find the client by application_name.",
			Run:    checkLongTransactions,
		},
		{
			ID: "sessions.locks_on_pgflow", Title: "locks held on pgflow tables", Severity: Warning,
			Meaning: "Locks other sessions hold or wait for on pgflow tables: strong modes (above ROW EXCLUSIVE), waits, or any lock of a transaction older than 5 s. " +
				"apply needs ACCESS EXCLUSIVE on flows, steps and step_tasks and would wait behind them (up to its lock timeout per try).",
			Remedy: "Let the holders finish, or stop them (select pg_terminate_backend(pid)), before apply.",
			Run:    checkLocksOnPgflow,
		},
	}
}

// sizeAndBackupChecks size the upgrade's work and check that a backup
// would keep the queues.
func sizeAndBackupChecks() []Check {
	return []Check{
		{
			ID: "size.tables", Title: "table sizes and backfill estimate", Severity: Info,
			Needs: NeedsPgflow,
			Meaning: "Rows (pg_class.reltuples, as of the last ANALYZE; a queue table never analysed is counted instead, up to 10,000 rows each for 20 tables, and the message says which) and bytes (pg_total_relation_size) of the pgflow tables and queue tables. " +
				"The upgrade writes queue_name into every pgflow.step_tasks row and builds its unique index under ACCESS EXCLUSIVE: that is the backfill work and the lock window.",
			Remedy: "Plan the window from the step_tasks size (measure with apply --dry-run on a restored copy); prune old runs first to shrink it.",
			Run:    checkSizes,
		},
		{
			ID: "backup.pgdump_pgmq", Title: "backups include the queues", Severity: Warning, Preflight: true,
			Needs: NeedsPGMQ,
			Meaning: "Below pgmq 1.6.0 the extension registers its queue tables as extension members without pg_extension_config_dump, so pg_dump leaves pgmq.meta, " +
				"every q_/a_ table and all their rows out. From 1.6.0 they are detached and pgmq.meta is marked for pg_dump, so pg_dump includes them, " +
				"except the tables of a queue listed in pgmq.meta under a mixed-case name (the 1.6.0 update detaches pgmq.\"q_<name>\" and misses them). " +
				"Read from pg_depend and pg_extension, per queue; nothing is reported without queues. Unlogged queues are also missing from physical backups and replicas.",
			Remedy: "Before apply take a physical backup or provider snapshot (pg_basebackup, PITR), or export the queue tables next to pg_dump " +
				"(\\copy (select * from pgmq.q_<queue>) to ...), and check that a restore brings the messages back.",
			Run: checkBackup,
		},
	}
}

func checkSchemaState(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	s := env.Schema
	var samples []map[string]any
	for _, d := range s.Differences {
		if len(samples) < env.Sample {
			samples = append(samples, map[string]any{"difference": d})
		}
	}
	f := c.finding(int64(len(s.Differences)), "schema state "+string(s.State)+": "+s.Describe(), samples)
	switch s.State {
	case versions.SchemaBaseline:
		f.Severity, f.Remedy, f.Count = Info, "None: this is the shape apply starts from.", 0
	case versions.SchemaUpgraded:
		f.Severity, f.Remedy, f.Count = Info, "None: apply will report that there is nothing to do.", 0
	case versions.SchemaOlder:
		f.Count = 1
	case versions.SchemaPartial:
		// Between the two shapes by design while an online upgrade of ours
		// runs (the version detection names it, with its phase): a state
		// with a next command, as `status` says, not a damaged schema. With
		// its progress table (which exists only while one of ours runs) it is
		// a warning in the audit; the preflight keeps it a blocker (apply
		// starts from the baseline only).
		v := s.Version
		if v == nil || v.Online == nil {
			break
		}
		f.Message = "an online upgrade (apply --online) is in progress (phase " + v.Online.Phase + "): the schema is between 0.16.0 and the upgraded shape until it ends"
		if len(s.Differences) > 0 {
			f.Message += "; what differs from 0.16.0 so far: " + strings.Join(s.Differences, "; ")
		}
		f.Remedy = "Continue it with `" + v.Online.Continue + "`, or undo it with `" + v.Online.Undo + "`; `pgflow-upgrade status` shows its phase and progress."
		var progress bool
		if env.Mode == ModeAudit {
			if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.online_progress') is not null`).Scan(&progress); err != nil {
				return nil, err
			}
		}
		if progress {
			f.Severity = Warning
		}
	}
	if s.Version != nil && f.Severity == Blocker {
		f.Remedy = s.Version.NextStep // what to do about this version
	}
	return []Finding{f}, nil
}
