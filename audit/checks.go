package audit

import "slices"

// allChecks is every check, in output order: the checks of every plan, then
// each hop's own. IDs are stable: scripts and apply's output refer to them.
var allChecks = slices.Concat(planChecks, hopChecks)

// planChecks are the checks of every plan (Hop EveryPlan). The data checks
// name the 0.17.0 migration statement their finding would make fail (the
// migration runs in one transaction, so any of them fails it whole).
var planChecks = []Check{
	// What is installed: the pgflow version and schema state, and pgmq.
	schemaState,
	pgmqInstalled,
	// What pgmq's version means for pgflow: a version that breaks the claim
	// path now, and whether the update to the newest pgmq the server offers
	// would go through.
	pgmqClaimPath,
	pgmqUpdatePath,
	// The rows that would make a 0.17.0 migration statement fail, and with it the whole migration.
	flowsCaseAlias,
	stepsCaseAlias,
	slugsStrictRule,
	flowsQueueNameTooLong,
	tasksDuplicateMessageID,
	// Queues and workers: what the upgrade changes for them.
	pgmqUnownedQueue,
	pgmqQueueCaseSpellings,
	workersLegacyAlive,
	pgmqFlowQueueMissing,
	pgmqQueuePhysical,
	// Sessions that would wait on the upgrade's locks, or make it wait.
	sessionsLongTransactions,
	sessionsLocksOnPgflow,
	// Sizes and backups.
	sizeTables,
	backupPgdumpPGMQ,
	// The plan of hops, and apply --quiesce.
	planHops,
	quiesceRecorded,
	quiesceInventory,
}

// hopChecks are each hop's own checks, in the order of their hops (a list
// of its own because plan.hops, which runs them in the audit, is one of
// planChecks). A new hop's checks go here, defined in checks_hops.go.
var hopChecks = []Check{
	hopsValidStatus,       // file 22, 0.15.1
	hopsOwnedQueueMissing, // file 25, 0.17.1
	hopsPgCron,            // file 26, 0.17.1
}
