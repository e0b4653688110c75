// Package rehearsal holds the rehearsal (`fixtures replay --from CAPTURE`):
// apply's plan from the captured release (Rehearsal.Plan) and its
// invariants replayed on a rebuilt copy of a user's database, as scenarios run by fixtures/scenario's Runner on clones of the
// restored capture, with the two figures an operator budgets for measured
// on it: the lock window of the transactional apply and the longest wait a
// client saw during `apply --online`. A digest compares every pre-existing
// row and message before and after, in bounded memory. internal/cli
// (`fixtures replay --from`) and upgrade_tests use it.
package rehearsal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/waitprobe"
)

// Rehearsal configures the capture scenarios and collects what they
// measured. Zero budgets are not checked (the figures are still reported).
type Rehearsal struct {
	// MaxLockWindow fails capture-upgrade-survives when the transactional
	// apply holds its locks longer.
	MaxLockWindow time.Duration
	// MaxWait fails capture-online-survives when the probe (a SELECT and an
	// UPDATE of one task row every 10 ms, lock_timeout 5 s) waits longer.
	MaxWait time.Duration
	// PGMQ: the runner's upgrade also runs the pgmq hop to this version
	// (fixtures replay --from FILE --pgmq VERSION): pgmq's queue list is
	// then compared with what the hop reports it renamed.
	PGMQ string
	// Plan is apply's plan from the captured release, made before the
	// restore with the files the replay was given (upgrade.MakePlan): the
	// upgrade the scenarios run must run these hops, no other (nil: not
	// checked).
	Plan *upgrade.Plan
	// PgflowMigrations is the user's copy of upstream's files the plan's
	// upstream hops run from ("" when it has none).
	PgflowMigrations string
	// To is the release the plan ends at (apply's --to; "" for upstream's
	// newest).
	To string

	mu sync.Mutex
	m  Measurements
}

// Measurements are the rehearsal's figures (zero: not measured).
type Measurements struct {
	ServerVersion string
	// Sizes of the rehearsed database (exact counts, before the upgrade).
	StepTasks, StepStates, Steps, Flows int64
	LockWindow, ApplyTotal              time.Duration // transactional apply
	OnlineTotal, OnlineLongestWait      time.Duration // apply --online and its probe
	OnlineLockWindow                    time.Duration // the online run's longest lock window
}

// Measured returns what the scenarios measured.
func (r *Rehearsal) Measured() Measurements {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

func (r *Rehearsal) record(f func(m *Measurements)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(&r.m)
}

// CaptureScenarios are Scenarios without budgets.
func CaptureScenarios() []scenario.Scenario { return Scenarios(&Rehearsal{}) }

// Scenarios replay the upgrade and its invariants on a captured
// state (every scenario's database is a clone of the restored capture).
func Scenarios(r *Rehearsal) []scenario.Scenario {
	return []scenario.Scenario{
		{Name: "capture-upgrade-survives", Run: r.survives,
			Proves: "the captured database upgrades with the transactional apply, along the plan made from the capture's release: every row, queue and message identical (to what upstream's own files run in order leave, when the plan runs them), new columns right, verify passes, and with upstream's files the catalog is their newest release's; the plan's lock window is measured (budget --max-lock-window)"},
		{Name: "capture-online-survives", Run: r.onlineSurvives,
			Proves: "the captured database upgrades with apply --online to where the plan ends while a probe reads and updates a task row every 10 ms: every row, queue and message identical (as above), new columns right, verify passes; the probe's longest wait is measured (budget --max-wait)"},
		{Name: "capture-old-worker-fenced", Run: captureFenced,
			Proves: "after the upgrade of the captured database a 0.16.0 worker's claim, start_tasks(flow_slug =>, msg_ids =>, worker_id =>), fails with 42883 and claims nothing"},
		{Name: "capture-new-worker-drains", Run: captureDrains,
			Proves: "after the upgrade of the captured database the new worker drains every in-flight run that can finish"},
	}
}

// OwnHopOnly: the plan is this tool's own hop alone (0.16.0 -> 0.17.0),
// what every rehearsal ran before plans from other releases (and what a
// calibration's forecast scales).
func (r *Rehearsal) OwnHopOnly() bool {
	return r.Plan == nil || (len(r.Plan.Hops) == 1 && r.Plan.Hops[0].Kind == upgrade.HopOwn)
}

// PlanSummary says the plan in one line: from, where it ends, its hops.
func (r *Rehearsal) PlanSummary() string {
	p := r.Plan
	if p == nil {
		return ""
	}
	var own, up []string
	for _, h := range p.Hops {
		if h.Kind == upgrade.HopOwn {
			own = append(own, fmt.Sprint(h.Upstream.Index))
		} else {
			up = append(up, fmt.Sprint(h.Upstream.Index))
		}
	}
	s := fmt.Sprintf("%s -> %s in %d hop(s)", p.From, p.Reached, len(p.Hops))
	var parts []string
	if len(up) > 0 {
		parts = append(parts, "upstream's files "+strings.Join(up, ", ")+" from "+p.Copy)
	}
	if len(own) > 0 {
		parts = append(parts, "this tool's own hop for file "+strings.Join(own, ", "))
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, "; ") + ")"
	}
	if p.Rest != "" {
		s += "; not rehearsed: " + p.Rest
	}
	return s
}

// reference returns, for a plan with hops of upstream's files, a copy of
// db taken where the plan ends by upstream's own files run in order, as
// `supabase db push` runs them (this tool's own hop included, as upstream's
// file): what the upgrade must leave every row and message as. Nil when the
// plan is this tool's own hop alone: rows then stay as they are.
func (r *Rehearsal) reference(ctx context.Context, env *scenario.Env, db *scenario.DB) (*scenario.DB, error) {
	if r.Plan == nil || !r.Plan.Needs() {
		return nil, nil
	}
	ref, err := env.Clone(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := env.PushUpstream(ctx, ref, r.Plan.FromFiles, r.Plan.ReachedFiles, false); err != nil {
		return nil, err
	}
	return ref, nil
}

// reached fails unless db is where the plan ends (upstream's release
// detected on it): what, the upgrade run, went all the way.
func (r *Rehearsal) reached(ctx context.Context, db *scenario.DB, what string) error {
	if r.Plan == nil {
		return nil
	}
	d, err := versions.Detect(ctx, db.Pool)
	if err != nil {
		return err
	}
	if d.Release == nil || d.Release.Files != r.Plan.ReachedFiles {
		return fmt.Errorf("%s left the copy at %s; the plan reaches %s", what, d.Summary(), r.Plan.Reached)
	}
	return nil
}

// identicalTo says what the rows were compared with, after "identical".
func (r *Rehearsal) identicalTo() string {
	if r.Plan == nil || !r.Plan.Needs() {
		return ""
	}
	files := fmt.Sprintf("files %d-%d", r.Plan.FromFiles+1, r.Plan.ReachedFiles)
	if r.Plan.ReachedFiles == r.Plan.FromFiles+1 {
		files = fmt.Sprintf("file %d", r.Plan.ReachedFiles)
	}
	return " to upstream's own " + files + " run in order on the same copy"
}

// samePlan fails when the upgrade ran another plan than the one made
// from the capture's header: the restored copy was not detected as the
// capture said, or apply planned otherwise.
func (r *Rehearsal) samePlan(ran *upgrade.Plan) error {
	want := r.Plan
	if want == nil || ran == nil {
		return nil
	}
	if ran.FromFiles != want.FromFiles || ran.ReachedFiles != want.ReachedFiles || len(ran.Hops) != len(want.Hops) {
		return fmt.Errorf("the upgrade ran the plan %s -> %s in %d hop(s); the capture's release plans %s -> %s in %d hop(s)",
			ran.From, ran.Reached, len(ran.Hops), want.From, want.Reached, len(want.Hops))
	}
	return nil
}

// sizes counts the tables the forecast scales by.
func (r *Rehearsal) sizes(ctx context.Context, db *scenario.DB) error {
	var m Measurements
	err := db.Pool.QueryRow(ctx, `select pg_catalog.current_setting('server_version'),
		(select pg_catalog.count(*) from pgflow.step_tasks), (select pg_catalog.count(*) from pgflow.step_states),
		(select pg_catalog.count(*) from pgflow.steps), (select pg_catalog.count(*) from pgflow.flows)`).
		Scan(&m.ServerVersion, &m.StepTasks, &m.StepStates, &m.Steps, &m.Flows)
	if err != nil {
		return fmt.Errorf("counting the rehearsed tables: %w", err)
	}
	r.record(func(x *Measurements) {
		x.ServerVersion, x.StepTasks, x.StepStates, x.Steps, x.Flows = m.ServerVersion, m.StepTasks, m.StepStates, m.Steps, m.Flows
	})
	return nil
}

func (r *Rehearsal) survives(ctx context.Context, env *scenario.Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if err := r.sizes(ctx, db); err != nil {
		return err
	}
	var rep *outcome.Result[*upgrade.Report]
	var queuesBefore []string
	if r.PGMQ != "" {
		if queuesBefore, err = queueList(ctx, db); err != nil {
			return err
		}
	}
	ref, err := r.reference(ctx, env, db)
	if err != nil {
		return err
	}
	rows, err := keeps(ctx, db, ref, "the upgrade", r.PGMQ == "", func() error {
		var err error
		if rep, err = env.Upgrade(ctx, db); err != nil {
			return fmt.Errorf("the upgrade failed: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if r.PGMQ != "" {
		if err := sameQueues(ctx, db, queuesBefore, rep); err != nil {
			return err
		}
		if p := rep.Report.PGMQ; p != nil {
			env.Notef("pgmq %s → %s in the same transaction: %d queue(s), %d pgmq.meta name(s) made to match their tables, claim path checked on %d before and %d after the commit",
				p.From, p.To, p.Queues, len(p.Repairs), p.ClaimChecked, p.ClaimCheckedAfter)
		}
	}
	if err := scenario.VerifyUpgraded(ctx, db); err != nil {
		return err
	}
	env.Notef("%d rows and messages identical%s", rows, r.identicalTo())
	if rep == nil {
		return nil
	}
	if err := r.samePlan(rep.Report.Plan); err != nil {
		return err
	}
	if r.Plan != nil && !r.OwnHopOnly() {
		env.Notef("plan: %s", r.PlanSummary())
	}
	if r.Plan != nil && r.PgflowMigrations != "" && r.Plan.Rest == "" {
		if err := scenario.SameCatalogAs(ctx, env, db, r.Plan.ReachedFiles); err != nil {
			return err
		}
		env.Notef("catalog exactly what upstream's files build at %s", r.Plan.Reached)
	}
	window := time.Duration(rep.Report.LockWindowMS) * time.Millisecond
	r.record(func(m *Measurements) {
		m.LockWindow, m.ApplyTotal = window, time.Duration(rep.Report.TotalMS)*time.Millisecond
	})
	env.Measure("apply_total", time.Duration(rep.Report.TotalMS)*time.Millisecond, 0)
	return env.Measure("lock_window", window, r.MaxLockWindow)
}

func (r *Rehearsal) onlineSurvives(ctx context.Context, env *scenario.Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	p := &waitprobe.Probe{ApplicationName: "pgflow-upgrade replay probe"}
	var rep *outcome.Result[*online.Report]
	var took time.Duration
	ref, err := r.reference(ctx, env, db)
	if err != nil {
		return err
	}
	rows, err := keeps(ctx, db, ref, "apply --online", true, func() error {
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		ready := make(chan struct{})
		perr := make(chan error, 1)
		go func() { perr <- p.Run(pctx, db.DSN, ready) }()
		select {
		case <-ready:
		case err := <-perr:
			return fmt.Errorf("the probe did not start: %w", err)
		}
		conn, err := session.Open(ctx, db.DSN, session.Rehearsal) // as the CLI's apply --online
		if err != nil {
			stop()
			<-perr
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		started := time.Now()
		rep, err = online.Upgrade(ctx, conn, online.Options{Switch: upgrade.Options{PgflowMigrations: r.PgflowMigrations, To: r.To}})
		took = time.Since(started)
		stop()
		if perr := <-perr; perr != nil && err == nil {
			return fmt.Errorf("the probe: %w", perr)
		}
		if err != nil {
			return fmt.Errorf("apply --online: %w", err)
		}
		if err := rep.Want(outcome.Applied); err != nil {
			return fmt.Errorf("apply --online: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := scenario.VerifyUpgraded(ctx, db); err != nil {
		return err
	}
	if err := r.reached(ctx, db, "apply --online"); err != nil {
		return err
	}
	probed := p.Result()
	longest := probed.Longest
	env.Notef("%d rows and messages identical%s; probe: %d operations, %d failed", rows, r.identicalTo(), probed.Statements, probed.Failures)
	lockWindow := time.Duration(rep.Report.LongestLockWindowMS) * time.Millisecond
	r.record(func(m *Measurements) {
		m.OnlineTotal, m.OnlineLongestWait, m.OnlineLockWindow = took, longest, lockWindow
	})
	env.Measure("online_total", took, 0)
	env.Measure("online_lock_window", lockWindow, 0)
	return env.Measure("online_longest_wait", longest, r.MaxWait)
}

// keeps runs upgrade and checks every pre-existing row and message of db
// against a digest, and that the new columns hold the right values. It
// returns the rows compared. The digest is db's own before the upgrade,
// every row unchanged, when ref is nil; else ref's, the same database
// taken along the plan by upstream's own files (Rehearsal.reference):
// upstream's files repair rows on their way (a failed run's stale tasks
// cancelled, for one), and apply must leave every row and message as they
// do.
func keeps(ctx context.Context, db, ref *scenario.DB, what string, queueList bool, upgrade func() error) (int64, error) {
	src, against := db, "in pre-existing state"
	if ref != nil {
		src, against = ref, "from what upstream's own files run in order leave"
	}
	d, err := takeDigest(ctx, src.Pool, queueList)
	if err != nil {
		return 0, err
	}
	defer d.close()
	if err := upgrade(); err != nil {
		return 0, err
	}
	diffs, total, err := d.compare(ctx, db.Pool, 20)
	if err != nil {
		return 0, err
	}
	if total > 0 {
		return 0, fmt.Errorf("%d differences %s after %s:\n%s", total, against, what, strings.Join(diffs, "\n"))
	}
	nd, err := fingerprint.CheckNewColumns(ctx, db.Pool)
	if err != nil {
		return 0, err
	}
	if len(nd) > 0 {
		return 0, fmt.Errorf("new columns wrong after %s:\n%s", what, fingerprint.Format(nd, 20))
	}
	return d.rows, nil
}

func captureFenced(ctx context.Context, env *scenario.Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	state := `select count(*) filter (where status = 'started') || '/' || coalesce(sum(attempts_count), 0) from pgflow.step_tasks`
	var before, after string
	if err := db.Pool.QueryRow(ctx, state).Scan(&before); err != nil {
		return err
	}
	// A 0.16.0 worker's claim (fixtures/oldworker's), with every message id of the captured tasks.
	_, callErr := db.Pool.Exec(ctx, `select * from pgflow.start_tasks(flow_slug => (select min(flow_slug) from pgflow.flows),
		msg_ids => array(select message_id from pgflow.step_tasks where message_id is not null),
		worker_id => '00000000-0000-0000-0000-000000000000'::uuid)`)
	if code := scenario.SQLState(callErr); code != scenario.UndefinedFunction {
		return fmt.Errorf("a 0.16.0 start_tasks call after the upgrade: SQLSTATE %q, want %s (%v)", code, scenario.UndefinedFunction, callErr)
	}
	if err := db.Pool.QueryRow(ctx, state).Scan(&after); err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("the rejected claim changed tasks (started/attempts %s -> %s)", before, after)
	}
	return nil
}

func captureDrains(ctx context.Context, env *scenario.Env) error {
	db, err := env.NewDB(ctx)
	if err != nil {
		return err
	}
	open, err := scenario.CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if _, err := env.Upgrade(ctx, db); err != nil {
		return fmt.Errorf("the upgrade failed: %w", err)
	}
	rep, err := scenario.Drain(ctx, db, scenario.DrainOptions{FastForward: true, Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	still, err := scenario.CountRows(ctx, db, `select count(*) from pgflow.runs where status = 'started'`)
	if err != nil {
		return err
	}
	if still != len(rep.Stuck) {
		return fmt.Errorf("%d runs still started after the drain (%d stuck by design)", still, len(rep.Stuck))
	}
	env.Notef("%d in-flight runs, %d tasks completed, %d stuck by design (permanently stalled)", open, rep.Completed, len(rep.Stuck))
	return nil
}

// queueList is pgmq's queue list, one line a queue: name, partitioned,
// unlogged, created_at (UTC).
func queueList(ctx context.Context, db *scenario.DB) ([]string, error) {
	rows, err := db.Pool.Query(ctx, `select q.queue_name::text || ' ' || q.is_partitioned || ' ' || q.is_unlogged || ' ' ||
			pg_catalog.to_char(q.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
		from pgmq.list_queues() q order by q.queue_name`)
	if err != nil {
		return nil, fmt.Errorf("listing pgmq's queues: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing pgmq's queues: %w", err)
	}
	return out, nil
}

// sameQueues: pgmq's queue list after the pgmq hop is the one before with
// exactly the hop's reported repairs (a name renamed to lower case, or a
// duplicate spelling removed), nothing else.
func sameQueues(ctx context.Context, db *scenario.DB, before []string, rep *outcome.Result[*upgrade.Report]) error {
	repairs := map[string]upgrade.PGMQRepair{}
	if rep != nil && rep.Report.PGMQ != nil {
		for _, x := range rep.Report.PGMQ.Repairs {
			repairs[x.Queue] = x
		}
	}
	var want []string
	for _, line := range before {
		name, rest, _ := strings.Cut(line, " ")
		x, ok := repairs[name]
		switch {
		case !ok:
			want = append(want, line)
		case strings.HasPrefix(x.Action, "renamed"):
			want = append(want, strings.ToLower(name)+" "+rest)
		}
	}
	slices.Sort(want)
	after, err := queueList(ctx, db)
	if err != nil {
		return err
	}
	slices.Sort(after)
	if !slices.Equal(want, after) {
		return fmt.Errorf("pgmq's queue list after the pgmq hop is not the one before with the hop's %d reported repair(s):\nwant %v\ngot  %v", len(repairs), want, after)
	}
	return nil
}
