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
	{StepPrivileges, fixed("the current role may alter the pgflow schema"), nil, (*applyRun).privileges},
	{StepTableLocks, func(*applyRun) string { return lockPlanText() }, nil, (*applyRun).tableLocks},
	{StepPreflight, fixed("the shared check catalog, exact, under the locks"), (*applyRun).preflightFirst, (*applyRun).runPreflight},
	{"", nil, nil, (*applyRun).runHops}, // the plan (hops.go): one StepMigrate per pending migration of ours, one StepHop per upstream file
	{StepPostChecks, fixed("the schema is pgflow 0.17.0 and the 0.16.0 claim is gone"), nil, (*applyRun).postChecks},
	{"", nil, nil, (*applyRun).beforeCommit},
	{StepSupabase, fixed("pgflow_upgrade.schema_revisions; supabase_migrations.schema_migrations when asked"), nil, (*applyRun).record},
	{StepCommit, fixed(""), func(a *applyRun) bool { return !a.opts.DryRun }, (*applyRun).commit},
	{StepRollback, fixed(""), func(a *applyRun) bool { return a.opts.DryRun }, (*applyRun).rollbackDryRun},
	{"", nil, nil, (*applyRun).finish},
}

// fixed is a step detail that does not depend on the run.
func fixed(detail string) func(*applyRun) string {
	return func(*applyRun) string { return detail }
}
