package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// UndefinedFunction is SQLSTATE 42883: what a 0.16.0 claim gets after the upgrade.
const UndefinedFunction = "42883"

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
		{Name: "step-route-without-worker", Run: stepRouteWithoutWorker,
			Proves: "after the upgrade, a step-mode flow whose second step has no worker: its message waits in that step's private queue and the route check (verify --routes) fails naming the flow, step, queue, count and what to deploy; once the package worker serves that step the run completes and the check passes"},
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

// VerifyUpgraded runs `verify` on db and the new worker's startup protocol
// check: an error says which check refused the upgraded database.
func VerifyUpgraded(ctx context.Context, db *DB) error {
	conn, err := session.Open(ctx, db.DSN, session.Rehearsal) // as the CLI's verify
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
	if err := VerifyUpgraded(ctx, db); err != nil {
		return err
	}
	env.Notef("%d rows and messages identical", before.RowCount())
	return nil
}

// SQLState is the SQLSTATE of a Postgres error in err's chain, "" without one.
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// CountRows runs a one-number query (a count) on db.
func CountRows(ctx context.Context, db *DB, sql string, args ...any) (int, error) {
	var n int
	if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("%s: %w", strings.TrimSpace(sql), err)
	}
	return n, nil
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
	open, err := CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	finished, err := CountRows(ctx, db, `select count(*) from pgflow.runs where status <> 'started'`)
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
	completed, err := CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'completed'`)
	if err != nil {
		return err
	}
	stillOpen, err := CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if stillOpen != len(rep.Stuck) || open == 0 {
		return errorf("%d runs still started after the drain (%d stuck by design), %d were open before", stillOpen, len(rep.Stuck), open)
	}
	env.Notef("%d in-flight runs drained (%d tasks); %d runs now completed, %d finished before", open, rep.Completed, completed, finished)
	return nil
}

// quiet discards the simulator's and workers' logs: results carry what matters.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
