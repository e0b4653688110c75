package upgrade

import "fmt"

// applyStep is one step of apply's plan, declared: its name (a Step*
// constant: progress, the test hooks and the report's timings; "" for a
// step that is not timed on its own), what it does, when it runs (nil:
// always) and how. Every step from begin on runs in the one upgrade
// transaction, and its undo is that transaction's rollback: any failure
// rolls back every step before it (rollbackUnlessDone), and a dry run rolls
// back on purpose at its end. The checks are steps like the others, at the
// point they must run: the state and the privileges before any table lock,
// the preflight under the locks, the post-conditions before commit.
type applyStep struct {
	name   string
	detail func(a *applyRun) string
	when   func(a *applyRun) bool
	run    func(a *applyRun) error
}

// applyPlan is Apply, in order; a step that finds nothing to do (admit on
// an upgraded database) ends it with success.
var applyPlan = []applyStep{
	{StepIntegrity, fixed("embedded migrations against atlas.sum"), nil, (*applyRun).integrity},
	{"", nil, nil, (*applyRun).prebuild}, // one StepPrebuild per statement built the online way
	{StepBegin, fixed(""), nil, (*applyRun).begin},
	{StepAdvisoryLock, func(a *applyRun) string {
		return fmt.Sprintf("pg_try_advisory_xact_lock(%d), waiting up to %s", AdvisoryLockKey, a.opts.Wait)
	}, nil, (*applyRun).advisoryLock},
	{StepState, fixed("detecting the schema state"), nil, (*applyRun).readState},
	{"", nil, nil, (*applyRun).admit},
	{StepPGMQState, func(a *applyRun) string {
		return "the installed pgmq, pgmq " + a.pgmq.target.String() + " offered, the queue tables"
	}, withPGMQ, (*applyRun).pgmqState},
	{StepPrivileges, fixed("the current role may alter the pgflow schema"), pgflowHops, (*applyRun).privileges},
	{"", nil, pgflowHops, (*applyRun).pgmqBeforeLocks},
	{"", nil, pgflowHops, (*applyRun).prepareScope},
	{"", nil, pgflowHops, (*applyRun).prebuiltIndexesBeforeLocks},
	{StepHopsEarly, fixed("upstream's function statements and ledger rows, before the table locks (they lock nothing the application uses)"),
		hasEarlyHops, (*applyRun).runEarly},
	// The records lock nothing the application uses either: written before
	// the table locks, committed or rolled back with the rest.
	{StepSupabase, fixed("pgflow_upgrade.schema_revisions; supabase_migrations.schema_migrations when asked"), pgflowHops, (*applyRun).record},
	{StepTableLocks, func(a *applyRun) string { return lockPlanText(a.lockPlan()) }, nil, (*applyRun).tableLocks},
	{StepPreflight, fixed("the shared check catalog, exact, under the locks"), (*applyRun).preflightFirst, (*applyRun).runPreflight},
	{"", nil, pgflowHops, (*applyRun).runHops}, // the plan (hops.go): one StepMigrate per pending migration of ours, one StepHop per upstream file
	{StepPostChecks, fixed("the schema is pgflow 0.17.0 and the 0.16.0 claim is gone"), pgflowHops, (*applyRun).postChecks},
	// The pgmq hop (pgmqhop.go) after pgflow's, in the same transaction.
	{StepPGMQUpdate, func(a *applyRun) string {
		return "pgmq.meta names matched to their tables, ALTER EXTENSION pgmq UPDATE TO '" + a.pgmq.target.String() + "', the claim path of every queue"
	}, (*applyRun).pgmqActive, (*applyRun).pgmqUpdate},
	{"", nil, nil, (*applyRun).beforeCommit},
	{StepCommit, fixed(""), func(a *applyRun) bool { return !a.opts.DryRun }, (*applyRun).commit},
	{StepRollback, fixed(""), func(a *applyRun) bool { return a.opts.DryRun }, (*applyRun).rollbackDryRun},
	{StepReleaseAfter, fixed("the whole catalog, read after the commit: the release reached"),
		func(a *applyRun) bool { return a.wholeAfterCommit && !a.opts.DryRun }, (*applyRun).releaseAfterCommit},
	{StepPGMQClaimAfter, fixed("pgmq's read and set_vt on every queue, after the commit"), func(a *applyRun) bool { return a.pgmqActive() && !a.opts.DryRun }, (*applyRun).pgmqClaimAfter},
	{"", nil, nil, (*applyRun).finish},
}

// withPGMQ: apply --pgmq was asked for.
func withPGMQ(a *applyRun) bool { return a.pgmq != nil }

// pgflowHops: the run has pgflow hops to take (not the pgmq hop alone).
func pgflowHops(a *applyRun) bool { return !a.pgmqOnly }

// fixed is a step detail that does not depend on the run.
func fixed(detail string) func(*applyRun) string {
	return func(*applyRun) string { return detail }
}
