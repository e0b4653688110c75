package upgrade

// The pgmq hop (apply --pgmq VERSION): pgmq's own update (ALTER EXTENSION
// pgmq UPDATE TO VERSION, PostgreSQL running pgmq's update scripts in
// order) as a step of apply's plan, under the same guard as the pgflow
// hop: the advisory lock, bounded ordered table locks with retries, a
// preflight under the locks, what makes the update fail repaired first in
// the same transaction, a post-check of the claim path before commit and
// again after it.
//
// It runs after the pgflow hop, in the same transaction when that hop has
// work to do: pgflow 0.17 finds its queues case-insensitively and creates
// them in lower case, so the repair (pgmq.meta names made to match their
// lower-case tables) changes nothing it sees; pgflow 0.16.0 compares the
// listed spelling exactly (its create_flow would list a second spelling,
// its delete_flow_and_data would leave the renamed row behind).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Refusals of the pgmq hop (exit 1, nothing changed).
var (
	ErrPGMQTarget  = errors.New("refusing the pgmq target")
	ErrPGMQScripts = errors.New("the server cannot update pgmq to the target: its update scripts are not installed")
	ErrPGMQDamaged = errors.New("a queue listed in pgmq.meta has no table: the pgmq update would fail on it")
	// ErrPGMQClaim: pgmq's read, pop or set_vt fails on a queue after the
	// update (before commit: rolled back; after: the update is committed).
	ErrPGMQClaim = errors.New("pgmq's claim path fails")
)

// Steps of the pgmq hop.
const (
	StepPGMQState      = "pgmq_state"
	StepPGMQUpdate     = "pgmq_update"
	StepPGMQClaimAfter = "pgmq_claim_after_commit"
)

// PGMQRepair is one pgmq.meta row the hop changed so that the update finds
// the queue's table.
type PGMQRepair struct {
	Queue  string `json:"queue"`  // as it was listed
	Table  string `json:"table"`  // pgmq.q_<lower(queue)>, the queue's table
	Action string `json:"action"` // "renamed to <lower>" or "removed: <lower> is listed too"
}

// PGMQReport is what the pgmq hop did (Report.PGMQ).
type PGMQReport struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Queues int    `json:"queues"` // listed in pgmq.meta under the locks
	// Locked: the pgmq tables the hop locked, in order (pgmq.meta, then
	// each queue's q_ and a_ table by name).
	Locked  []string     `json:"locked"`
	Repairs []PGMQRepair `json:"repairs"`
	// UpdateMS: ALTER EXTENSION pgmq UPDATE itself.
	UpdateMS int64 `json:"update_ms"`
	// ClaimChecked: queues whose read, read_with_poll, pop and set_vt were
	// called under the locks after the update (in a savepoint rolled back);
	// ClaimCheckedAfter: queues whose read and set_vt were called again
	// after the commit (with no row to touch).
	ClaimChecked      int `json:"claim_checked_before_commit"`
	ClaimCheckedAfter int `json:"claim_checked_after_commit"`
	// NothingToDo: pgmq was already at the target.
	NothingToDo bool `json:"nothing_to_do,omitempty"`
}

// pgmqHop is the hop's state through the plan.
type pgmqHop struct {
	target, from pgmqver.Version
	locks        []TableLock // read before the locks are taken
	queues       []string    // pgmq.meta names read before the locks
	r            *PGMQReport
}

// parsePGMQTarget validates --pgmq before anything is opened: a version
// number, and not 1.10.0 or 1.10.1 (they break the claim path of every
// queue created before them).
func parsePGMQTarget(s string) (pgmqver.Version, error) {
	v, err := pgmqver.Parse(s)
	if err != nil {
		return v, fmt.Errorf("%w: %w", ErrPGMQTarget, err)
	}
	if pgmqver.BreaksClaim(v) {
		return v, fmt.Errorf("%w %s: on pgmq 1.10.0 and 1.10.1 read, pop and set_vt fail (42804) on every queue created before 1.10.0, so no pgflow worker could claim; choose 1.11.0 or later", ErrPGMQTarget, v)
	}
	return v, nil
}

// pgmqState reads, before any table lock, what the hop starts from: the
// installed pgmq, the target offered by the server, the right to update
// it, and the queue tables it will lock. a.done ends the plan when pgmq is
// already there and the pgflow hop has nothing to do either.
func (a *applyRun) pgmqState() error {
	ctx, tx, h := a.ctx, a.tx, a.pgmq
	var version, owner *string
	var mayAlter, offered bool
	err := tx.QueryRow(ctx, `
		select e.extversion, e.extowner::pg_catalog.regrole::text,
		       coalesce(coalesce((select r.rolsuper from pg_catalog.pg_roles r where r.rolname = current_user), false)
		         or pg_catalog.pg_has_role(current_user, e.extowner, 'MEMBER'), false),
		       exists (select 1 from pg_catalog.pg_available_extension_versions v where v.name = 'pgmq' and v.version = $1)
		  from (select 1) one left join pg_catalog.pg_extension e on e.extname = 'pgmq'`, h.target.String()).
		Scan(&version, &owner, &mayAlter, &offered)
	if err != nil {
		return fmt.Errorf("reading the pgmq extension: %w", err)
	}
	if version == nil {
		return a.fail(outcome.Refused, fmt.Errorf("%w: pgmq is not installed as an extension here (CREATE EXTENSION pgmq), so there is no update to run", ErrPGMQTarget))
	}
	if h.from, err = pgmqver.Parse(*version); err != nil {
		return a.fail(outcome.Refused, fmt.Errorf("%w: the installed pgmq %q is not a version this tool reads", ErrPGMQTarget, *version))
	}
	h.r.From, h.r.To = h.from.String(), h.target.String()
	switch {
	case h.target.Less(h.from):
		return a.fail(outcome.Refused, fmt.Errorf("%w %s: pgmq %s is installed and extensions are not downgraded", ErrPGMQTarget, h.target, h.from))
	case h.target == h.from:
		h.r.NothingToDo = true
		if a.pgmqOnly {
			a.res.Outcome, a.res.Message, a.done = outcome.AlreadyApplied, "pgmq is already at "+h.from.String()+" and pgflow at "+a.plan.Reached+": nothing to do", true
		}
		return nil
	case !offered:
		return a.fail(outcome.Refused, fmt.Errorf("%w (pg_available_extension_versions has no pgmq %s): install pgmq's update scripts pgmq--%s--*.sql ... --%s.sql "+
			"into the server's extension directory ($(pg_config --sharedir)/extension; on a managed service, ask for pgmq %s), then rerun",
			ErrPGMQScripts, h.target, h.from, h.target, h.target))
	case !mayAlter:
		return a.fail(outcome.Refused, fmt.Errorf("%w: ALTER EXTENSION pgmq needs its owner (%s) or a superuser; run apply --pgmq as that role", ErrPGMQTarget, deref(owner)))
	}
	return a.readPGMQLocks()
}

// readPGMQLocks lists the pgmq tables the update alters, in the hop's lock
// order: pgmq.meta (EXCLUSIVE: no queue is created or dropped meanwhile,
// reads go on), then every existing q_ and a_ table of a listed queue by
// name (ACCESS EXCLUSIVE, which the update takes anyway; taking it here,
// bounded and retried, is what keeps the update from queueing behind a
// worker's transaction while every worker queues behind it).
func (a *applyRun) readPGMQLocks() error {
	h := a.pgmq
	rows, err := a.tx.Query(a.ctx, `
		select coalesce(pg_catalog.array_agg(m.queue_name::text order by m.queue_name), '{}') from pgmq.meta m`)
	if err != nil {
		return fmt.Errorf("listing pgmq.meta: %w", err)
	}
	h.queues, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[[]string])
	if err != nil {
		return fmt.Errorf("listing pgmq.meta: %w", err)
	}
	rows, err = a.tx.Query(a.ctx, `
		select c.relname::text from pg_catalog.pg_class c
		  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
		 where c.relkind in ('r', 'p')
		   and c.relname in (select p || '_' || pg_catalog.lower(m.queue_name::text) from pgmq.meta m, pg_catalog.unnest(array['q', 'a']) p)
		 order by c.relname collate "C"`)
	if err != nil {
		return fmt.Errorf("listing the queue tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing the queue tables: %w", err)
	}
	h.locks = []TableLock{{Schema: "pgmq", Table: "meta", Mode: "exclusive"}}
	for _, t := range tables {
		h.locks = append(h.locks, TableLock{Schema: "pgmq", Table: t, Mode: "access exclusive"})
	}
	return nil
}

// pgmqActive: the hop has an update to run.
func (a *applyRun) pgmqActive() bool { return a.pgmq != nil && !a.pgmq.r.NothingToDo }

// lockPlan is the run's one lock order: the pgflow hop's tables (LockPlan)
// when it runs, then the pgmq hop's.
func (a *applyRun) lockPlan() []TableLock {
	var plan []TableLock
	if !a.pgmqOnly {
		plan = append(plan, LockPlan...)
	}
	if a.pgmqActive() {
		plan = append(plan, a.pgmq.locks...)
	}
	return plan
}

// pgmqUpdate is the hop under the locks: the queues are those it locked,
// what makes the update fail is repaired, the update runs, and the claim
// path of every queue is called before the commit.
func (a *applyRun) pgmqUpdate() error {
	ctx, tx, h := a.ctx, a.tx, a.pgmq
	for _, l := range h.locks {
		h.r.Locked = append(h.r.Locked, l.Name())
	}
	// A queue created between the listing and the locks has tables the
	// update would wait for, unbounded by our retries: start again.
	var now []string
	if err := tx.QueryRow(ctx, `select coalesce(pg_catalog.array_agg(m.queue_name::text order by m.queue_name), '{}') from pgmq.meta m`).Scan(&now); err != nil {
		return fmt.Errorf("listing pgmq.meta under the locks: %w", err)
	}
	if !slices.Equal(now, h.queues) {
		return a.fail(outcome.LockBusy, fmt.Errorf("pgmq.meta changed while apply took its locks (a queue was created or dropped): nothing was changed; rerun apply"))
	}
	h.r.Queues = len(now)
	if err := a.pgmqRepair(); err != nil {
		return err
	}
	start := time.Now()
	// The target passed pgmqver.Parse: digits and dots only.
	if _, err := tx.Exec(ctx, `alter extension pgmq update to '`+h.target.String()+`'`); err != nil {
		return fmt.Errorf("ALTER EXTENSION pgmq UPDATE TO '%s' (from %s; rolled back, nothing was changed): %w", h.target, h.from, err)
	}
	h.r.UpdateMS = time.Since(start).Milliseconds()
	var got string
	if err := tx.QueryRow(ctx, `select e.extversion from pg_catalog.pg_extension e where e.extname = 'pgmq'`).Scan(&got); err != nil {
		return fmt.Errorf("reading the pgmq version after the update: %w", err)
	}
	if got != h.target.String() {
		return a.fail(outcome.Refused, fmt.Errorf("%w: after the update pgmq is %s, not %s: rolled back", ErrPostConditions, got, h.target))
	}
	if left, err := audit.Mismatches(ctx, tx, 1); err != nil || len(left) > 0 {
		return a.fail(outcome.Refused, fmt.Errorf("%w: a pgmq.meta name still does not match its table after the repair (%v): rolled back", ErrPostConditions, errors.Join(err, fmt.Errorf("%v", left))))
	}
	n, err := probeClaimPath(ctx, tx, now, true)
	h.r.ClaimChecked = n
	if err != nil {
		return a.fail(outcome.Refused, fmt.Errorf("%w (rolled back, nothing was changed): %w", ErrPGMQClaim, err))
	}
	return nil
}

// pgmqRepair makes every pgmq.meta name match its table, as pgmq's update
// steps address them ('q_' || name): a mixed-case name is renamed to the
// lower case pgmq gave its tables, or removed when that spelling is listed
// too (both rows name one set of tables). pgflow 0.17 resolves its queue
// names case-insensitively and pgmq's functions lower every name, so both
// find every queue as before. A listed queue without a table is refused:
// no rename gives it one.
func (a *applyRun) pgmqRepair() error {
	ctx, tx, h := a.ctx, a.tx, a.pgmq
	mism, err := audit.Mismatches(ctx, tx, -1)
	if err != nil {
		return err
	}
	for _, m := range mism {
		if !m.Repairable() {
			return a.fail(outcome.Refused, fmt.Errorf("%w: queue %q (pgmq.%s is missing); recreate it (select pgmq.create('%s')) or drop its pgmq.meta row, then rerun (audit: pgmq.queue_physical)",
				ErrPGMQDamaged, m.Name, m.Table, strings.ToLower(m.Name)))
		}
	}
	for _, m := range mism {
		rep := PGMQRepair{Queue: m.Name, Table: "pgmq." + m.Table}
		sql := `update pgmq.meta set queue_name = pg_catalog.lower(queue_name) where queue_name = $1`
		rep.Action = "renamed to " + strings.ToLower(m.Name)
		if m.LowerListed {
			sql = `delete from pgmq.meta where queue_name = $1`
			rep.Action = "removed: " + strings.ToLower(m.Name) + " is listed too"
		}
		if _, err := tx.Exec(ctx, sql, m.Name); err != nil {
			return fmt.Errorf("repairing pgmq.meta row %q (%s): %w", m.Name, rep.Action, err)
		}
		h.r.Repairs = append(h.r.Repairs, rep)
	}
	return nil
}

// probeClaimPath calls pgmq's claim functions on every queue, as a worker
// would, and returns how many queues answered. With full (under the
// hop's locks, before commit) each queue gets read, set_vt and, when a
// message is visible, read_with_poll and pop, in a savepoint rolled back:
// nothing changes. Without it (after commit, next to live workers) read
// with qty 0 and set_vt of no message: they plan and type-check their
// query (where 1.10.0/1.10.1 fail) and touch no row.
func probeClaimPath(ctx context.Context, tx pgx.Tx, queues []string, full bool) (int, error) {
	for i, q := range queues {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return i, fmt.Errorf("savepoint before probing queue %q: %w", q, err)
		}
		err = probeQueue(ctx, sp, q, full)
		if rbErr := sp.Rollback(context.WithoutCancel(ctx)); err == nil && rbErr != nil {
			err = fmt.Errorf("rolling back the probe of queue %q: %w", q, rbErr)
		}
		if err != nil {
			return i, err
		}
	}
	return len(queues), nil
}

func probeQueue(ctx context.Context, q pgx.Tx, queue string, full bool) error {
	qty := 0
	if full {
		qty = 1
	}
	var read int64
	if err := q.QueryRow(ctx, `select pg_catalog.count(*) from pgmq.read($1, 0, $2)`, queue, qty).Scan(&read); err != nil {
		return fmt.Errorf("pgmq.read on queue %q: %w", queue, err)
	}
	var n int64
	if err := q.QueryRow(ctx, `select pg_catalog.count(*) from pgmq.set_vt($1, -1::bigint, 0)`, queue).Scan(&n); err != nil {
		return fmt.Errorf("pgmq.set_vt on queue %q: %w", queue, err)
	}
	if !full || read == 0 {
		return nil
	}
	// The message read with vt 0 is visible again: read_with_poll returns
	// it at once instead of polling.
	if err := q.QueryRow(ctx, `select pg_catalog.count(*) from pgmq.read_with_poll($1, 0, 1, 1, 10)`, queue).Scan(&n); err != nil {
		return fmt.Errorf("pgmq.read_with_poll on queue %q: %w", queue, err)
	}
	if err := q.QueryRow(ctx, `select pg_catalog.count(*) from pgmq.pop($1)`, queue).Scan(&n); err != nil {
		return fmt.Errorf("pgmq.pop on queue %q: %w", queue, err)
	}
	return nil
}

// pgmqClaimAfter calls the claim path of every queue again once the update
// is committed, in a transaction of its own that changes nothing. A
// failure here is reported as such: the update is committed.
func (a *applyRun) pgmqClaimAfter() error {
	ctx, h := a.ctx, a.pgmq
	tx, err := a.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("beginning the claim probe after the pgmq update: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := (session.Limits{Lock: a.opts.LockTimeout}).Set(ctx, tx); err != nil {
		return err
	}
	n, err := probeClaimPath(ctx, tx, h.queues, false)
	h.r.ClaimCheckedAfter = n
	if err != nil {
		return a.fail(outcome.Failed, fmt.Errorf("%w after the commit (pgmq %s is committed): %w", ErrPGMQClaim, h.target, err))
	}
	return nil
}

// message is the hop's part of the run's message.
func (h *pgmqHop) message(dryRun bool) string {
	if h.r.NothingToDo {
		return "pgmq already at " + h.r.To
	}
	checked := "before and after commit"
	if dryRun {
		checked = "before the rollback"
	}
	s := fmt.Sprintf("pgmq %s → %s (%d queue(s), claim path checked %s", h.r.From, h.r.To, h.r.Queues, checked)
	if len(h.r.Repairs) > 0 {
		s += fmt.Sprintf("; %d pgmq.meta name(s) made to match their tables", len(h.r.Repairs))
	}
	return s + ")"
}

func deref(s *string) string {
	if s == nil {
		return "?"
	}
	return *s
}
