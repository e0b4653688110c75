package audit

// allChecks is every check, in output order. IDs are stable: scripts and
// apply's output refer to them. The data checks name the 0.17.0 migration
// statement their finding would make fail (the migration runs in one
// transaction, so any of them fails it whole).
var allChecks = []Check{
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
