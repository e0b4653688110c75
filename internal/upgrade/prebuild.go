package upgrade

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// The online way for upstream's blocking statements, on both paths. Two
// kinds of statement in upstream's files block the application for a scan
// or a build: a plain CREATE INDEX on a pgflow table (0.17.1's three: writes
// to the table blocked for the whole build) and the swap of step_tasks'
// valid_status CHECK (file 22: ACCESS EXCLUSIVE on step_tasks for a full
// scan). Before apply's transaction, each index is built CONCURRENTLY under
// its own name, and the new CHECK is added NOT VALID (a brief lock, no
// scan) under a name of this tool's, then validated under SHARE UPDATE
// EXCLUSIVE (reads and writes go on). In the transaction the file's index
// statement is then found already done, and the CHECK swap becomes a drop
// of the old constraint and a rename of the validated one: the same end
// catalog, without the scan under the locks. If the run fails (or is a dry
// run), what was built beforehand is removed: the database is at its
// starting release.

// StepPrebuild is the step that builds before the transaction.
const StepPrebuild = "prebuild"

// prebuildCheckName is the validated CHECK's name until the swap.
const prebuildCheckName = "pgflow_upgrade_valid_status"

var (
	// CREATE [UNIQUE] INDEX "name" ON "pgflow"."table" <rest>
	indexStmt = regexp.MustCompile(`(?is)^CREATE\s+(UNIQUE\s+)?INDEX\s+"([a-z0-9_]+)"\s+ON\s+"pgflow"\."([a-z0-9_]+)"\s+(.+?);?\s*$`)
	// ALTER TABLE "pgflow"."step_tasks" DROP CONSTRAINT "valid_status", ADD CONSTRAINT "valid_status" CHECK (<expr>)
	checkSwapStmt = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+"pgflow"\."step_tasks"\s+DROP\s+CONSTRAINT\s+"valid_status",\s*ADD\s+CONSTRAINT\s+"valid_status"\s+(CHECK\s*\(.+\))\s*;?\s*$`)
	// UPDATE pgflow.step_tasks AS task SET status = ... <join> AND task.status IN ('queued', 'started')
	activeRepairStmt = regexp.MustCompile(`(?is)^(UPDATE\s+pgflow\.step_tasks\s+AS\s+task\s+SET\s+status\s*=\s*'[a-z]+'\s+FROM\s.+\sAND\s+)task\.status\s+IN\s+\(\s*'queued'\s*,\s*'started'\s*\)\s*;?\s*$`)
)

// prebuilt is what was built before the transaction, and what each of
// upstream's statements becomes in it.
type prebuilt struct {
	indexes []string // pgflow index names built CONCURRENTLY
	check   bool     // pgflow.step_tasks.pgflow_upgrade_valid_status added
	// instead: by upstream file index and statement index (0-based), the
	// statements run in place of the file's ("" entries skipped: found done).
	instead map[int]map[int][]string
	// indexDone: by index name, whether it was found done before the table
	// locks (prebuiltIndexesBeforeLocks); a name not there is looked up.
	indexDone map[string]bool
}

func (p *prebuilt) replace(file, stmt int, with ...string) {
	if p.instead == nil {
		p.instead = map[int]map[int][]string{}
	}
	if p.instead[file] == nil {
		p.instead[file] = map[int][]string{}
	}
	p.instead[file][stmt] = with
}

// prebuild runs before the transaction: from the release the database is
// at now (read without locks), the plan's blocking statements are built
// the online way. The transaction re-reads the state and plans again; a
// statement whose prebuilt object is not there runs as written.
func (a *applyRun) prebuild() error {
	if a.copy == nil || a.copyErr != nil {
		return nil
	}
	// The upgrade's advisory lock, at session level, from here until the
	// run ends (released after dropPrebuilt): another apply neither builds
	// the same objects nor commits a plan that uses ours while we may still
	// drop them. Busy: nothing is built, and the transaction's own advisory
	// lock step waits or says who holds it.
	if err := a.conn.QueryRow(a.ctx, `select pg_catalog.pg_try_advisory_lock($1)`, AdvisoryLockKey).Scan(&a.sessionLocked); err != nil {
		return fmt.Errorf("prebuild: taking the upgrade's advisory lock: %w", err)
	}
	if !a.sessionLocked {
		return nil
	}
	d, err := versions.Detect(a.ctx, a.conn)
	if err != nil {
		return nil // the transaction says what the state is
	}
	from := -1
	switch {
	case a.opts.AcceptState != nil && (d.State == versions.StateOnline || d.State == versions.StateReady):
		from = ownHopFile - 1 // the switch of apply --online: our hop, then upstream's
	case d.Release != nil && d.Release.Refusal() == "":
		from = d.Release.Files
	}
	if from < 0 {
		return nil
	}
	plan := MakePlan(from, a.target, a.copy, a.opts.TelemetryOff)
	a.pre = &prebuilt{}
	for _, h := range plan.Hops {
		if h.Kind != HopUpstream {
			continue
		}
		if err := a.hopChecksBeforeLocks(h); err != nil {
			return err
		}
		file, err := a.upstreamText(h)
		if err != nil {
			return err
		}
		for i, st := range file.stmts {
			if err := a.prebuildStatement(h, i, st); err != nil {
				return err
			}
		}
	}
	return nil
}

// prebuildStatement builds one blocking statement's object the online way.
func (a *applyRun) prebuildStatement(h Hop, i int, st string) error {
	if m := indexStmt.FindStringSubmatch(st); m != nil {
		name := m[2]
		exists, valid, same, err := a.indexState(a.conn, name, st)
		if err != nil {
			return fmt.Errorf("prebuilding %s: %w", name, err)
		}
		switch {
		case exists && valid && same:
			// Left by an earlier run that stopped after building it (killed,
			// or the server went away): found done in the transaction. Not
			// ours to drop if this run fails: it was there before.
			a.pre.replace(h.Upstream.Index, i)
			return nil
		case exists && !valid && same:
			// An interrupted CONCURRENTLY build leaves its index invalid:
			// never used, still maintained on every write. Dropped, then
			// built again.
			drop := fmt.Sprintf(`DROP INDEX CONCURRENTLY IF EXISTS "pgflow"."%s"`, name)
			if err := a.prebuildExec(fmt.Sprintf("dropping the invalid index %s an interrupted build left", name), drop); err != nil {
				return err
			}
		case exists:
			return nil // another index under that name: the file's statement says so itself
		}
		// Upstream's own statement (verified by its hash), CONCURRENTLY.
		build := fmt.Sprintf(`CREATE %sINDEX CONCURRENTLY "%s" ON "pgflow"."%s" %s`, strings.ToUpper(m[1]), name, m[3], m[4])
		a.pre.indexes = append(a.pre.indexes, name)
		if err := a.prebuildExec(fmt.Sprintf("index %s on pgflow.%s CONCURRENTLY (for %s)", name, m[3], h.File), build); err != nil {
			return err
		}
		a.pre.replace(h.Upstream.Index, i) // found done in the transaction
		return nil
	}
	if m := activeRepairStmt.FindStringSubmatch(st); m != nil {
		// File 22's repairs of active tasks (queued or started) cannot run
		// beforehand: the old valid_status CHECK rejects the statuses they
		// write until the swap. As written (status IN (...)) no index
		// matches, so each scans all step_tasks under the locks; one
		// statement per status reaches the same rows through the partial
		// indexes upstream keeps on queued and on started tasks, so its
		// time grows with the active tasks only. The rows and values
		// written are the same: the first statement's rows leave the set
		// the second one selects.
		a.pre.replace(h.Upstream.Index, i,
			m[1]+`task.status = 'queued'`,
			m[1]+`task.status = 'started'`)
		return nil
	}
	if m := checkSwapStmt.FindStringSubmatch(st); m != nil {
		// One left by an earlier run that stopped before its commit (its
		// name is this tool's own) goes first: a catalog-only drop, under
		// the lock timeout.
		leftover := fmt.Sprintf(`ALTER TABLE "pgflow"."step_tasks" DROP CONSTRAINT IF EXISTS "%s"`, prebuildCheckName)
		var left bool
		if err := a.conn.QueryRow(a.ctx, `select exists (select 1 from pg_catalog.pg_constraint
			where conrelid = pg_catalog.to_regclass('pgflow.step_tasks') and conname = $1)`, prebuildCheckName).Scan(&left); err != nil {
			return fmt.Errorf("prebuilding step_tasks' CHECK: %w", err)
		}
		if left {
			if err := a.prebuildExec("dropping the CHECK "+prebuildCheckName+" an earlier run left", leftover); err != nil {
				return err
			}
		}
		a.pre.check = true
		add := fmt.Sprintf(`ALTER TABLE "pgflow"."step_tasks" ADD CONSTRAINT "%s" %s NOT VALID`, prebuildCheckName, m[1])
		if err := a.prebuildExec("step_tasks' new valid_status CHECK, NOT VALID (for "+h.File+")", add); err != nil {
			return err
		}
		validate := fmt.Sprintf(`ALTER TABLE "pgflow"."step_tasks" VALIDATE CONSTRAINT "%s"`, prebuildCheckName)
		if err := a.prebuildExec("validating it under SHARE UPDATE EXCLUSIVE", validate); err != nil {
			return err
		}
		a.pre.replace(h.Upstream.Index, i,
			`ALTER TABLE "pgflow"."step_tasks" DROP CONSTRAINT "valid_status"`,
			fmt.Sprintf(`ALTER TABLE "pgflow"."step_tasks" RENAME CONSTRAINT "%s" TO "valid_status"`, prebuildCheckName))
	}
	return nil
}

// prebuildExec runs one statement outside the transaction, as a timed
// step, its lock waits bounded by the lock timeout.
func (a *applyRun) prebuildExec(detail, stmt string) error {
	return a.step(StepPrebuild, detail, func() error {
		// CONCURRENTLY runs outside a transaction: the lock_timeout is the
		// session's for this statement, set and put back.
		var was string
		if err := a.conn.QueryRow(a.ctx, `select pg_catalog.current_setting('lock_timeout')`).Scan(&was); err != nil {
			return fmt.Errorf("prebuild: reading lock_timeout: %w", err)
		}
		set := `select pg_catalog.set_config('lock_timeout', $1, false)`
		if _, err := a.conn.Exec(a.ctx, set, fmt.Sprintf("%dms", max(a.opts.LockTimeout.Milliseconds(), 1))); err != nil {
			return fmt.Errorf("prebuild: setting lock_timeout: %w", err)
		}
		defer a.conn.Exec(context.WithoutCancel(a.ctx), set, was)
		t := time.Now()
		_, err := a.conn.Exec(a.ctx, stmt)
		took := time.Since(t)
		a.r.Statements = append(a.r.Statements, StatementReport{Migration: "prebuild", Index: len(a.r.Statements) + 1, Summary: summary(stmt),
			DurationMS: took.Milliseconds(), DurationUS: took.Microseconds()})
		if err != nil {
			return fmt.Errorf("building before the transaction (%s): %w", detail, err)
		}
		return nil
	})
}

// dropUnusedCheck removes the prebuilt CHECK after a committed run whose
// transaction did not swap it in (its plan changed under it): a leftover
// of this tool's, never upstream's catalog. Looked up first, so a run that
// used it takes no lock here.
func (a *applyRun) dropUnusedCheck() error {
	if a.pre == nil || !a.pre.check {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), time.Minute)
	defer cancel()
	var left bool
	if err := a.conn.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_constraint
		where conrelid = pg_catalog.to_regclass('pgflow.step_tasks') and conname = $1)`, prebuildCheckName).Scan(&left); err != nil {
		return fmt.Errorf("looking for the prebuilt CHECK %s: %w", prebuildCheckName, err)
	}
	if !left {
		return nil
	}
	if _, err := a.conn.Exec(ctx, `ALTER TABLE "pgflow"."step_tasks" DROP CONSTRAINT IF EXISTS "`+prebuildCheckName+`"`); err != nil {
		return fmt.Errorf("removing the unused prebuilt CHECK %s: %w", prebuildCheckName, err)
	}
	return nil
}

// releasePrebuild gives back the session-level advisory lock prebuild took.
func (a *applyRun) releasePrebuild() error {
	if !a.sessionLocked {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), 10*time.Second)
	defer cancel()
	if _, err := a.conn.Exec(ctx, `select pg_catalog.pg_advisory_unlock($1)`, AdvisoryLockKey); err != nil {
		return fmt.Errorf("releasing the upgrade's advisory lock: %w", err)
	}
	return nil
}

// dropPrebuilt removes what prebuild built, after a failed or dry run:
// the database is at its starting release again. An index the committed
// transaction made upstream's own is not dropped (the run succeeded).
func (a *applyRun) dropPrebuilt() error {
	if a.pre == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), time.Minute)
	defer cancel()
	var errs []error
	for _, name := range a.pre.indexes {
		if _, err := a.conn.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS "pgflow".`+pgx.Identifier{name}.Sanitize()); err != nil {
			errs = append(errs, fmt.Errorf("removing index pgflow.%s built before the failed run: %w", name, err))
		}
	}
	if a.pre.check {
		if _, err := a.conn.Exec(ctx, `ALTER TABLE "pgflow"."step_tasks" DROP CONSTRAINT IF EXISTS "`+prebuildCheckName+`"`); err != nil {
			errs = append(errs, fmt.Errorf("removing the CHECK %s built before the failed run: %w", prebuildCheckName, err))
		}
	}
	return errors.Join(errs...)
}

// insteadOf is what runs in place of statement i of upstream's file n (ok
// false: the statement itself). An index statement is found done only when
// the index there is the one the statement builds.
func (a *applyRun) insteadOf(n, i int, stmt string) ([]string, bool, error) {
	if a.pre == nil || a.pre.instead[n] == nil {
		return nil, false, nil
	}
	with, ok := a.pre.instead[n][i]
	if !ok {
		return nil, false, nil
	}
	if m := indexStmt.FindStringSubmatch(stmt); m != nil {
		done, ok := a.pre.indexDone[m[2]]
		if !ok {
			var err error
			if done, err = a.prebuiltIndexDone(m[2], stmt); err != nil {
				return nil, false, err
			}
		}
		if !done {
			return nil, false, nil // not there, or not the same index: the statement says so itself
		}
	}
	return with, true, nil
}

// prebuiltIndexDone: the index name built beforehand is there, valid, and
// the one stmt builds.
func (a *applyRun) prebuiltIndexDone(name, stmt string) (bool, error) {
	exists, valid, same, err := a.indexState(a.tx, name, stmt)
	if err != nil {
		return false, fmt.Errorf("looking for the prebuilt index %s: %w", name, err)
	}
	return exists && valid && same, nil
}

// indexState says whether pgflow's index name exists, whether it is valid,
// and whether it is the index stmt builds.
func (a *applyRun) indexState(q Querier, name, stmt string) (exists, valid, same bool, err error) {
	var def string
	err = q.QueryRow(a.ctx, `select i.indexrelid is not null, coalesce(i.indisvalid, false), coalesce(pg_catalog.pg_get_indexdef(i.indexrelid), '')
		from (select pg_catalog.to_regclass(pg_catalog.format('pgflow.%I', $1::text)) as oid) r
		left join pg_catalog.pg_index i on i.indexrelid = r.oid`, name).Scan(&exists, &valid, &def)
	return exists, valid, exists && normIndex(def) == normIndex(stmt), err
}

// prebuiltIndexesBeforeLocks looks, in the transaction but before its
// table locks, at the indexes built beforehand, so that under the locks
// their statements are found done without a query each. An index dropped
// between this look and the locks would leave its statement skipped and
// the index missing, which the post-conditions (the index's table is one
// the plan changes) refuse, rolling everything back.
func (a *applyRun) prebuiltIndexesBeforeLocks() error {
	if a.pre == nil || len(a.pre.indexes) == 0 || a.plan == nil {
		return nil
	}
	a.pre.indexDone = map[string]bool{}
	for _, h := range a.plan.Hops {
		if h.Kind != HopUpstream || a.pre.instead[h.Upstream.Index] == nil {
			continue
		}
		file, err := a.upstreamText(h)
		if err != nil {
			return err
		}
		for i, st := range file.stmts {
			if _, ok := a.pre.instead[h.Upstream.Index][i]; !ok {
				continue
			}
			if m := indexStmt.FindStringSubmatch(st); m != nil {
				done, err := a.prebuiltIndexDone(m[2], st)
				if err != nil {
					return err
				}
				a.pre.indexDone[m[2]] = done
			}
		}
	}
	return nil
}

// insteadLabel heads the report's summary of a statement run as with.
func insteadLabel(stmt string, with []string) string {
	if len(with) > 0 && activeRepairStmt.MatchString(stmt) {
		return "one statement per active status (through the partial indexes): "
	}
	return "already built beforehand: " // found done, or swapped in
}

// normIndex reduces an index definition to compare pg_get_indexdef's text
// with a file's statement.
func normIndex(s string) string {
	s = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), ";"))
	s = strings.NewReplacer(`"`, "", " using btree", "", "concurrently ", "").Replace(s)
	return strings.Join(strings.Fields(s), " ")
}

// joinCleanup adds a cleanup's error to the run's, leaving the run's error
// as it is (its type and sentinels) when the cleanup succeeded.
func joinCleanup(err, cleanup error) error {
	if cleanup == nil {
		return err
	}
	return errors.Join(err, cleanup)
}
