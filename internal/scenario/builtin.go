package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/oldworker"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// undefinedFunction is SQLSTATE 42883: what a 0.16.0 claim gets after the upgrade.
const undefinedFunction = "42883"

// Builtin returns the built-in scenarios in the order they are reported.
func Builtin() []Scenario {
	return []Scenario{
		{Name: "clean-upgrade", Run: cleanUpgrade,
			Proves: "an in-flight 0.16.0 state built through the real engine (runs started/completed/failed; tasks queued, started, retried, completed, failed, cancelled, skipped; steps skipped by unmet conditions, dependencies and exhausted handlers; a 25-task map; messages visible, invisible, archived) upgrades: every row and message identical, queue_mode and queue_name right, verify passes, the new worker's startup check accepts it"},
		{Name: "old-worker-after-upgrade", Run: oldWorkerAfterUpgrade,
			Proves: "a 0.16.0 worker started after the upgrade compiles (its 2-argument call resolves through the defaults) and registers, and heartbeats, then fails at its first non-empty claim with SQLSTATE 42883 (3-argument start_tasks): nothing claimed, no attempt counted, the messages it read visible again after their visibility timeout"},
		{Name: "old-worker-during-upgrade", Run: oldWorkerDuringUpgrade,
			Proves: "a 0.16.0 worker running during the upgrade fails loudly on its next claim (start_tasks: SQLSTATE 42883); the messages it read become visible again and the new worker finishes every run: nothing lost"},
		{Name: "concurrent-traffic", Run: concurrentTraffic,
			Proves: "start_flow and complete_task from other sessions (lock_timeout 2s) during apply: no deadlock, waits bounded by the lock timeout (longest reported), an apply that gives up on its locks changes nothing and its rerun (at most 3 runs) succeeds, every committed write survives with the right queue_name"},
		{Name: "malformed-case-aliases", Run: malformed(sabotageCaseAliases),
			Proves: "flow slugs that differ only in case (one physical queue): apply refuses, the database is unchanged"},
		{Name: "malformed-step-case-aliases", Run: malformed(sabotageStepCaseAliases),
			Proves: "two steps of one flow whose slugs differ only in case: apply refuses, the database is unchanged"},
		{Name: "malformed-strict-slug", Run: malformed(sabotageStrictSlug),
			Proves: "a slug valid in 0.16.0 that 0.17.0's rule rejects (a__b): apply refuses, the database is unchanged"},
		{Name: "malformed-long-queue-name", Run: malformed(sabotageLongQueueName),
			Proves: "a flow whose lower(flow_slug) is over pgmq's 47 characters: apply refuses, the database is unchanged"},
		{Name: "malformed-duplicate-message-id", Run: malformed(sabotageDuplicateMessageID),
			Proves: "tasks of one queue sharing a message id (the unique (queue_name, message_id) cannot be built): apply refuses, the database is unchanged"},
		{Name: "unowned-queue-warns", Run: unownedQueue,
			Proves: "a pgmq queue named like a flow that no flow owns does not block apply but is warned about (pgmq.unowned_queue); it and its message are kept; afterwards 0.17.0's create_flow refuses a flow of that name (23505), as the warning says"},
		{Name: "state-survival", Run: stateSurvival,
			Proves: "random 0.16.0 states (seeds 1-4: DAGs, maps, every task and message status): the fingerprint of every pre-existing row and queue message is identical after the upgrade and the new columns hold the right values"},
		{Name: "realtime-events", Run: realtimeEvents,
			Proves: "the same operations (a run crossing the upgrade, a 12-task map, retries, a failing run with a late answer, conditions skip/skip-cascade/fail, exhausted steps skipped and cascaded, a taskless map) on 0.16.0 and after the upgrade record the same realtime broadcasts (event, topic, private, payload; timestamps aside) and end in the same run/step/task states; after the upgrade every event of a replaced function has the facts' topic, private=false and payload keys; the upgrade itself broadcasts nothing"},
		{Name: "new-worker-drains", Run: newWorkerDrains,
			Proves: "after the upgrade the new worker (package worker) drains every in-flight run of the in-flight state to completion, and no message of a finished run is left in a queue"},
	}
}

// survive upgrades db between two fingerprints and checks survival and the
// new columns.
func survive(ctx context.Context, env *Env, db *DB) (*fingerprint.Fingerprint, error) {
	before, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return nil, err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return nil, fmt.Errorf("the upgrade failed: %w", err)
	}
	after, err := fingerprint.Take(ctx, db.Pool)
	if err != nil {
		return nil, err
	}
	if d := fingerprint.Compare(before, after); len(d) > 0 {
		return nil, fmt.Errorf("%d differences in pre-existing state after the upgrade:\n%s", len(d), fingerprint.Format(d, 20))
	}
	d, err := fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		return nil, err
	}
	if len(d) > 0 {
		return nil, fmt.Errorf("new columns wrong after the upgrade:\n%s", fingerprint.Format(d, 20))
	}
	return before, nil
}

// loadInflight builds fixtures' inflight state in a fresh database.
func loadInflight(ctx context.Context, env *Env) (*DB, error) {
	db, err := env.NewEmptyDB(ctx)
	if err != nil {
		return nil, err
	}
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		return nil, err
	}
	if err := st.Load(ctx, db.Pool); err != nil {
		return nil, fmt.Errorf("loading the inflight state: %w", err)
	}
	return db, nil
}

// verifyUpgraded runs `verify` and the new worker's startup protocol check.
func verifyUpgraded(ctx context.Context, db *DB) error {
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rep, err := upgrade.Verify(ctx, conn)
	if err != nil {
		return err
	}
	if !rep.OK {
		var bad []string
		for _, c := range upgrade.Failed(rep.Checks) {
			bad = append(bad, c.ID+": "+c.Detail)
		}
		return fmt.Errorf("verify failed after the upgrade: %s", strings.Join(bad, "; "))
	}
	if err := worker.CheckProtocol(ctx, db.Pool); err != nil {
		return fmt.Errorf("the new worker's startup protocol check refuses the upgraded database: %w", err)
	}
	return nil
}

func cleanUpgrade(ctx context.Context, env *Env) error {
	db, err := loadInflight(ctx, env)
	if err != nil {
		return err
	}
	c, err := TakeCensus(ctx, db.Pool)
	if err != nil {
		return err
	}
	if m := c.Missing(inflightKinds); len(m) > 0 {
		return fmt.Errorf("the in-flight state lacks %s (has: %s)", strings.Join(m, ", "), c)
	}
	before, err := survive(ctx, env, db)
	if err != nil {
		return err
	}
	if err := verifyUpgraded(ctx, db); err != nil {
		return err
	}
	env.Notef("%d rows and messages identical", before.RowCount())
	return nil
}

// oldFlow is the flow the old-worker scenarios run: a → b.
var oldFlow = oldworker.Flow{
	Slug:    "legacy",
	Options: oldworker.Options{MaxAttempts: oldworker.Int(3), BaseDelay: oldworker.Int(0), Timeout: oldworker.Int(1)},
	Steps:   []oldworker.Step{{Slug: "a"}, {Slug: "b", DependsOn: []string{"a"}}},
}

func oldHandlers(block <-chan struct{}) map[string]oldworker.Handler {
	h := func(ctx context.Context, t oldworker.Task) (any, error) {
		if block != nil {
			select {
			case <-block:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{"step": t.StepSlug}, nil
	}
	return map[string]oldworker.Handler{"a": h, "b": h}
}

// startLegacy compiles and starts the legacy flow with a 0.16.0 worker that
// then stops, and starts n runs.
func startLegacy(ctx context.Context, db *DB, n int) error {
	w := oldworker.New(db.Pool, oldworker.Config{FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(nil), Logger: quiet})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("0.16.0 worker before the upgrade: %w", err)
	}
	if err := w.Stop(ctx); err != nil {
		return err
	}
	for i := range n {
		if _, err := db.Pool.Exec(ctx, `select count(*) from pgflow.start_flow($1, $2::jsonb)`, oldFlow.Slug, mustJSON(map[string]int{"i": i})); err != nil {
			return fmt.Errorf("start_flow: %w", err)
		}
	}
	return nil
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func countRows(ctx context.Context, db *DB, sql string, args ...any) (int, error) {
	var n int
	if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", strings.TrimSpace(sql), err)
	}
	return n, nil
}

func oldWorkerAfterUpgrade(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if err := startLegacy(ctx, db, 2); err != nil {
		return err
	}
	if _, err := survive(ctx, env, db); err != nil {
		return err
	}
	queued := `select count(*) from pgflow.step_tasks where flow_slug = $1 and status = 'queued' and attempts_count = 0`
	queuedBefore, err := countRows(ctx, db, queued, oldFlow.Slug)
	if err != nil {
		return err
	}
	// 0.17.0: its two-argument compile resolves to the four-argument
	// ensure_flow_compiled through the defaults ('verified'), so it starts
	// and registers; its first non-empty claim fails with 42883.
	w := oldworker.New(db.Pool, oldworker.Config{FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(nil),
		VisibilityTimeout: 1, Logger: quiet})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("a 0.16.0 worker must still start on 0.17.0 (its compile resolves through the defaults): %w", err)
	}
	defer w.Stop(context.WithoutCancel(ctx))
	registered, err := countRows(ctx, db, `select count(*) from pgflow.workers where worker_id = $1::uuid`, w.ID())
	if err != nil {
		return err
	}
	if registered != 1 {
		return errorf("the 0.16.0 worker did not register (%d rows): 0.17.0 lets it register before its claim fails", registered)
	}
	_, claimErr := w.PollOnce(ctx)
	if code := pgCode(claimErr); code != undefinedFunction || !strings.Contains(claimErr.Error(), "start_tasks") {
		return fmt.Errorf("the 0.16.0 worker's first claim: SQLSTATE %q, want %s at start_tasks: %w", code, undefinedFunction, claimErr)
	}
	queuedAfter, err := countRows(ctx, db, queued, oldFlow.Slug)
	if err != nil {
		return err
	}
	if queuedAfter != queuedBefore || queuedAfter == 0 {
		return errorf("the failed claim changed tasks: %d queued and never attempted before, %d after", queuedBefore, queuedAfter)
	}
	claimedBy, err := countRows(ctx, db, `select count(*) from pgflow.step_tasks where last_worker_id = $1::uuid or status = 'started'`, w.ID())
	if err != nil {
		return err
	}
	if claimedBy != 0 {
		return errorf("the failed claim left %d tasks started or attributed to the 0.16.0 worker", claimedBy)
	}
	// It still heartbeats: 0.17.0 keeps pgflow.workers as 0.16.0 had it.
	if _, err := db.Pool.Exec(ctx, `update pgflow.workers set last_heartbeat_at = now() - interval '1 hour' where worker_id = $1::uuid`, w.ID()); err != nil {
		return err
	}
	if _, err := w.Heartbeat(ctx); err != nil {
		return fmt.Errorf("the 0.16.0 worker's heartbeat after the upgrade: %w", err)
	}
	fresh, err := countRows(ctx, db, `select count(*) from pgflow.workers where worker_id = $1::uuid and last_heartbeat_at > now() - interval '1 minute'`, w.ID())
	if err != nil {
		return err
	}
	if fresh != 1 {
		return errorf("the 0.16.0 worker's heartbeat did not update its row after the upgrade")
	}
	// The messages its claim read (vt 1 s) become visible again.
	if err := waitFor(ctx, 15*time.Second, func() (bool, error) {
		n, err := countRows(ctx, db, `select count(*) from pgmq.q_legacy where vt > clock_timestamp()`)
		return n == 0, err
	}); err != nil {
		return fmt.Errorf("waiting for the messages read by the rejected claim to become visible: %w", err)
	}
	env.Notef("registered and heartbeats, then rejected at its first claim: %s", firstLine(claimErr.Error()))
	return nil
}

func oldWorkerDuringUpgrade(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	const runs = 4
	if err := startLegacy(ctx, db, runs); err != nil {
		return err
	}
	release := make(chan struct{})
	w := oldworker.New(db.Pool, oldworker.Config{
		FlowSlug: oldFlow.Slug, Shape: oldFlow.MustShape(), Handlers: oldHandlers(release),
		BatchSize: 2, VisibilityTimeout: 1, MaxPollSeconds: 1, Logger: quiet,
	})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("0.16.0 worker before the upgrade: %w", err)
	}
	// First claim before the upgrade: two tasks are in its handlers (started,
	// messages invisible) while the upgrade runs.
	first := make(chan error, 1)
	go func() {
		n, err := w.PollOnce(ctx)
		if err == nil && n != 2 {
			err = fmt.Errorf("first poll started %d tasks, want 2", n)
		}
		first <- err
	}()
	if err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		n, err := countRows(ctx, db, `select count(*) from pgflow.step_tasks where status = 'started'`)
		return n == 2, err
	}); err != nil {
		close(release)
		return fmt.Errorf("waiting for the 0.16.0 worker to start two tasks: %w", err)
	}
	_, upErr := env.Upgrade(ctx, db)
	close(release) // the handlers finish: complete_task exists after the upgrade too
	if upErr != nil {
		<-first
		return fmt.Errorf("the upgrade failed with a 0.16.0 worker running: %w", upErr)
	}
	if err := <-first; err != nil {
		return fmt.Errorf("the 0.16.0 worker's in-flight batch: %w", err)
	}
	// Its next claim reads messages (pgmq still works) and fails at start_tasks.
	n, err := w.PollOnce(ctx)
	if err == nil {
		return errorf("the 0.16.0 worker's claim after the upgrade succeeded (%d tasks)", n)
	}
	if code := pgCode(err); code != undefinedFunction || !strings.Contains(err.Error(), "start_tasks") {
		return fmt.Errorf("the 0.16.0 worker's claim failed with SQLSTATE %q, want %s at start_tasks: %w", code, undefinedFunction, err)
	}
	env.Notef("0.16.0 claim: %s", firstLine(err.Error()))
	// Nothing lost: every unfinished task still has its message in its queue.
	lost, err := countRows(ctx, db, `select count(*) from pgflow.step_tasks t
		where t.status in ('queued', 'started') and not exists (select 1 from pgmq.q_legacy m where m.msg_id = t.message_id)`)
	if err != nil {
		return err
	}
	if lost > 0 {
		return errorf("%d unfinished tasks lost their message", lost)
	}
	// The messages it read become visible again once their 1 s vt passes.
	if err := waitFor(ctx, 15*time.Second, func() (bool, error) {
		n, err := countRows(ctx, db, `select count(*) from pgmq.q_legacy where vt > clock_timestamp()`)
		return n == 0, err
	}); err != nil {
		return fmt.Errorf("waiting for the messages read by the rejected 0.16.0 claim to become visible: %w", err)
	}
	rep, err := Drain(ctx, db, DrainOptions{})
	if err != nil {
		return err
	}
	done, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'completed'`)
	if err != nil {
		return err
	}
	if done != runs {
		return errorf("%d of %d runs completed after the drain", done, runs)
	}
	env.Notef("new worker completed %d tasks", rep.Completed)
	return nil
}

// waitFor polls cond every 50 ms until it holds or limit passes.
func waitFor(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s", limit)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func stateSurvival(ctx context.Context, env *Env) error {
	total := 0
	for seed := uint64(1); seed <= 4; seed++ {
		db, err := env.NewDB(ctx)
		if err != nil {
			return err
		}
		if _, err := Generate(ctx, db.Pool, seed); err != nil {
			return err
		}
		before, err := survive(ctx, env, db)
		if err != nil {
			return fmt.Errorf("seed %d: %w", seed, err)
		}
		total += before.RowCount()
	}
	env.Notef("%d rows and messages identical over 4 seeds", total)
	return nil
}

func newWorkerDrains(ctx context.Context, env *Env) error {
	db, err := loadInflight(ctx, env)
	if err != nil {
		return err
	}
	open, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	finished, err := countRows(ctx, db, `select count(*) from pgflow.runs where status <> 'started'`)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	rep, err := Drain(ctx, db, DrainOptions{FastForward: true})
	if err != nil {
		return err
	}
	completed, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'completed'`)
	if err != nil {
		return err
	}
	stillOpen, err := countRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if stillOpen != len(rep.Stuck) || open == 0 {
		return errorf("%d runs still started after the drain (%d stuck by design), %d were open before", stillOpen, len(rep.Stuck), open)
	}
	env.Notef("%d in-flight runs drained (%d tasks); %d runs now completed, %d finished before", open, rep.Completed, completed, finished)
	return nil
}

// A sabotage turns a valid 0.16.0 state into a malformed one.
type sabotage struct {
	what  string
	sql   string
	check string // the audit check that must be among apply's blockers
}

var (
	sabotageCaseAliases     = sabotage{"case-only slug aliases", `select pgflow.create_flow('Legacy'); select pgflow.add_step('Legacy', 'a')`, "flows.case_alias"}
	sabotageStepCaseAliases = sabotage{"case-only step slug aliases", `select pgflow.add_step('legacy', 'A')`, "steps.case_alias"}
	sabotageStrictSlug      = sabotage{"slug 0.17.0 rejects", `select pgflow.add_step('legacy', 'a__b')`, "slugs.strict_rule"}
	// pgmq refuses such a queue, so only rows written directly have it (with
	// a step: a stepless long-slug flow is only a warning).
	sabotageLongQueueName = sabotage{"queue name over 47 characters",
		`insert into pgflow.flows (flow_slug) values ('legacy_` + strings.Repeat("x", 41) + `');
		 insert into pgflow.steps (flow_slug, step_slug) values ('legacy_` + strings.Repeat("x", 41) + `', 's')`, "flows.queue_name_too_long"}
	// Two tasks of one queue carrying the same message id: only a direct
	// write (or a restore gone wrong) makes one; the unique index on
	// (queue_name, message_id) cannot be built.
	sabotageDuplicateMessageID = sabotage{"duplicate (queue, message id)",
		`update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks where flow_slug = 'legacy')
		  where flow_slug = 'legacy' and task_index = 0`, "tasks.duplicate_message_id"}
)

// malformed: a valid state, then the sabotage; apply must refuse and leave
// the database exactly as it was.
func malformed(s sabotage) func(context.Context, *Env) error {
	return func(ctx context.Context, env *Env) error {
		db, err := env.NewDB(ctx)
		if err != nil {
			return err
		}
		if err := startLegacy(ctx, db, 3); err != nil {
			return err
		}
		if _, err := db.Pool.Exec(ctx, s.sql); err != nil {
			return fmt.Errorf("making the state malformed (%s): %w", s.what, err)
		}
		before, err := fingerprint.Take(ctx, db.Pool)
		if err != nil {
			return err
		}
		rep, err := env.Upgrade(ctx, db)
		if err == nil {
			return errorf("apply accepted a database with a %s", s.what)
		}
		// Refused for this reason: the preflight (or the migration's own
		// guard, a RAISE), not integrity, state detection or a lock.
		if !errors.Is(err, upgrade.ErrPreflight) && pgCode(err) != "P0001" {
			return fmt.Errorf("apply refused a database with a defect (%s), but for another reason: %w", s.what, err)
		}
		after, ferr := fingerprint.Take(ctx, db.Pool)
		if ferr != nil {
			return ferr
		}
		diffs := append(fingerprint.Compare(before, after), fingerprint.Added(before, after)...)
		if len(diffs) > 0 {
			return fmt.Errorf("apply refused but changed the database:\n%s", fingerprint.Format(diffs, 20))
		}
		// Still the 0.16.0 schema: no new column, no revision record, the
		// old functions in place.
		var changed bool
		if err := db.Pool.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_attribute
			  where (attrelid, attname) in (('pgflow.flows'::regclass, 'queue_mode'), ('pgflow.steps'::regclass, 'queue_name'),
			                                ('pgflow.step_tasks'::regclass, 'queue_name')) and not attisdropped)
			or pg_catalog.to_regclass('pgflow_upgrade.schema_revisions') is not null
			or pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid, text, text)') is not null
			or pg_catalog.to_regprocedure('pgflow.ensure_flow_compiled(text, jsonb)') is null
			or pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid)') is null`).Scan(&changed); err != nil {
			return err
		}
		if changed {
			return errorf("apply refused but the schema is no longer the 0.16.0 baseline")
		}
		why := firstLine(err.Error())
		if rep != nil && len(rep.Blockers) > 0 {
			var b []string
			found := false
			for _, f := range rep.Blockers {
				b = append(b, fmt.Sprintf("%s: %s", f.CheckID, f.Message))
				found = found || f.CheckID == s.check
			}
			why = strings.Join(b, "; ")
			if !found {
				return fmt.Errorf("apply refused a database with a %s, but not with check %s: %s", s.what, s.check, why)
			}
		}
		env.Notef("refused: %s", why)
		return nil
	}
}

// concurrentTraffic runs application sessions during apply.
func concurrentTraffic(ctx context.Context, env *Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	const preRuns = 12
	if err := startLegacy(ctx, db, preRuns); err != nil {
		return err
	}
	// Start every task a of the runs (as a 0.16.0 worker would), so the
	// application has complete_task work during the upgrade.
	wid := oldworker.NewID()
	if _, err := db.Pool.Exec(ctx, `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, 'legacy', 'app')`, wid); err != nil {
		return err
	}
	var tasks []string
	rows, err := db.Pool.Query(ctx, `select run_id::text from pgflow.start_tasks('legacy',
		array(select msg_id from pgmq.read('legacy', 60, 100)), $1::uuid) order by run_id`, wid)
	if err != nil {
		return err
	}
	tasks, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	if len(tasks) != preRuns {
		return errorf("started %d tasks, want %d", len(tasks), preRuns)
	}

	tr := newTraffic(db, tasks)
	// A session in the middle of a start_flow transaction when apply begins:
	// apply must wait for it (bounded), and it must be able to commit.
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := holder.Exec(ctx, `select count(*) from pgflow.start_flow('legacy', '{"holder": true}'::jsonb)`); err != nil {
		_ = holder.Rollback(ctx)
		return err
	}
	trafficDone := tr.start(ctx, 4)

	applied := make(chan error, 1)
	var applyRep *upgrade.Report
	var applyDone atomic.Bool
	// An apply that gives up on its table locks (bounded: lock_busy, nothing
	// changed) is rerun, as an operator would: under load the traffic can
	// hold pgflow.steps in the middle of a statement at each of its attempts.
	const maxApplyRuns = 3
	applyRuns := 0
	go func() {
		var err error
		for applyRuns = 1; ; applyRuns++ {
			var busy *upgrade.TableLockError
			applyRep, err = env.Upgrade(ctx, db)
			if err == nil || !errors.As(err, &busy) || applyRuns == maxApplyRuns {
				break
			}
			env.Logf("replay: concurrent-traffic: apply run %d gave up on its table locks (nothing changed), running it again", applyRuns)
		}
		applyDone.Store(true)
		applied <- err
	}()
	// Commit the holder once apply is queued behind it (or apply gave up).
	holderErr := waitFor(ctx, 20*time.Second, func() (bool, error) {
		if applyDone.Load() {
			return true, nil
		}
		n, err := countRows(ctx, db, `select count(*) from pg_catalog.pg_locks l
			where not l.granted and l.locktype = 'relation' and l.database = (select oid from pg_catalog.pg_database where datname = current_database())`)
		return n > 0, err
	})
	if err := holder.Commit(ctx); err != nil && holderErr == nil {
		holderErr = fmt.Errorf("the session that held locks when apply started could not commit: %w", err)
	}
	upErr := <-applied
	// Traffic keeps going a little after the upgrade, on the new schema.
	tr.waitOps(ctx, 8)
	tr.halt()
	<-trafficDone
	if upErr != nil {
		// What the sessions saw (a deadlock, a failure) says why apply could
		// not get its locks.
		if terr := tr.check(); terr != nil {
			return fmt.Errorf("apply under traffic: %w; meanwhile %v (longest application wait %s over %d ops)", upErr, terr, tr.longest().Round(time.Millisecond), tr.ops())
		}
		return fmt.Errorf("apply under traffic: %w (longest application wait %s over %d ops, %d lock timeouts)", upErr, tr.longest().Round(time.Millisecond), tr.ops(), tr.timeouts())
	}
	if holderErr != nil {
		return fmt.Errorf("waiting for apply to queue behind an open transaction: %w", holderErr)
	}
	if err := tr.check(); err != nil {
		return err
	}
	// Every committed write is there, with the right queue_name.
	if d, err := fingerprint.CheckNewColumns(ctx, db.Pool); err != nil || len(d) > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("new columns wrong after apply under traffic:\n%s", fingerprint.Format(d, 20))
	}
	started, err := countRows(ctx, db, `select count(*) from pgflow.runs`)
	if err != nil {
		return err
	}
	if want := preRuns + 1 + tr.startedRuns(); started != want {
		return errorf("%d runs after apply, want %d (%d before, 1 holder, %d started by the traffic)", started, want, preRuns, tr.startedRuns())
	}
	for _, run := range tr.completedTasks() {
		n, err := countRows(ctx, db, `select count(*) from pgflow.step_tasks where run_id = $1::uuid and step_slug = 'a' and status = 'completed'`, run)
		if err != nil {
			return err
		}
		if n != 1 {
			return errorf("task a of run %s was completed by the application but is not completed", run)
		}
	}
	lockWindow := int64(0)
	attempts := 0
	if applyRep != nil {
		lockWindow, attempts = applyRep.LockWindowMS, applyRep.LockAttempts
	}
	env.Notef("longest application wait %s over %d ops (%d lock timeouts, %d calls in flight across the row-type change failed with 42804 and were retried); apply lock window %d ms, %d lock attempts in its last of %d run(s)",
		tr.longest().Round(time.Millisecond), tr.ops(), tr.timeouts(), tr.stale(), lockWindow, attempts, applyRuns)
	return nil
}

// quiet discards the simulator's and workers' logs: results carry what matters.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
