package versions

// What each hop of upstream's history locks, as data: the audit's forecast
// per hop reads it (with the row counts of the tables named here), and
// docs/releases.md's lock table says the same in prose. Only statements that
// take a lock the application meets on a pgflow table are listed; a file
// that only replaces functions has none.

// OwnHopFile is the upstream file whose place this tool's own migration
// (0.16.0 -> 0.17.0, queue persistence) takes in a plan.
const OwnHopFile = 24

// HowRun says how apply runs a statement of upstream's file.
type HowRun string

const (
	// InTransaction: in apply's one guarded transaction, as written: its
	// lock is held until the commit.
	InTransaction HowRun = "in the transaction"
	// Beforehand: built before the transaction the online way (CREATE INDEX
	// CONCURRENTLY, or a CHECK added NOT VALID and validated under SHARE
	// UPDATE EXCLUSIVE), so reads and writes go on while it scans; in the
	// transaction the statement is found done or finished by a catalog-only
	// swap.
	Beforehand HowRun = "beforehand, online"
)

// StatementLock is one statement of an upstream file and the lock it takes.
type StatementLock struct {
	Statement string // what it does, short
	Table     string // the table locked, schema-qualified
	// Lock is the lock upstream's statement takes as written, and Blocks
	// what it blocks.
	Lock, Blocks string
	// GrowsWith is the table whose rows the statement's time grows with
	// ("" when it changes the catalog only).
	GrowsWith string
	// Indexed: apply reaches the statement's rows through upstream's
	// partial indexes on queued and on started tasks (one statement per
	// status), so it grows with the active tasks, not with the table.
	Indexed bool
	Run     HowRun
}

// hopLocks: upstream's files 21-27 (file 24 is this tool's own hop,
// whose cost the calibrated forecast gives).
var hopLocks = map[int][]StatementLock{
	21: {{Statement: "ADD CONSTRAINT worker_functions_start_mode_check", Table: "pgflow.worker_functions",
		Lock: "ACCESS EXCLUSIVE", Blocks: "reads and writes", GrowsWith: "pgflow.worker_functions", Run: InTransaction}},
	22: {
		{Statement: "valid_status CHECK replaced", Table: "pgflow.step_tasks", Lock: "ACCESS EXCLUSIVE", Blocks: "reads and writes",
			GrowsWith: "pgflow.step_tasks", Run: Beforehand},
		{Statement: "UPDATE step_tasks of skipped steps and failed runs", Table: "pgflow.step_tasks", Lock: "ROW EXCLUSIVE",
			Blocks: "the rows it updates", GrowsWith: "pgflow.step_tasks", Indexed: true, Run: InTransaction},
	},
	26: {
		{Statement: "CREATE INDEX idx_runs_started_at", Table: "pgflow.runs", Lock: "SHARE", Blocks: "writes",
			GrowsWith: "pgflow.runs", Run: Beforehand},
		{Statement: "ADD COLUMN workers.pgflow_version", Table: "pgflow.workers", Lock: "ACCESS EXCLUSIVE", Blocks: "reads and writes",
			Run: InTransaction},
		{Statement: "CREATE INDEX idx_workers_started_at, idx_workers_stopped_at", Table: "pgflow.workers", Lock: "SHARE", Blocks: "writes",
			GrowsWith: "pgflow.workers", Run: Beforehand},
	},
}

// HopLocks lists the statements of upstream's file n that lock a pgflow
// table (none for a file that only replaces functions). Shared: read only.
func HopLocks(n int) []StatementLock { return hopLocks[n] }
