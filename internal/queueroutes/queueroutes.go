// Package queueroutes answers, on a pgflow 0.17 database, "does every queue route
// have a live worker?": one row per route (a flow-mode flow's single queue,
// or one step of a step-mode flow) with the depth of its queue, the age of
// its oldest message and the workers that serve it, and the routes where
// messages wait with nobody able to claim them.
//
// pgflow 0.17 creates every step queue when a step-mode flow is compiled, but
// nothing waits for each step's worker to register: a step whose worker was
// never deployed, crashed, or is still a 0.16.0 worker (which registers and
// heartbeats, then fails at every claim) leaves its tasks in the queue while
// the run only looks slow. Read answers from the persisted routes
// (flows.queue_mode, steps.queue_name), the queue tables and pgflow.workers.
//
// Everything is read in one READ ONLY, REPEATABLE READ transaction with
// statement and lock timeouts set LOCAL (session.BeginReadOnly): only SELECTs,
// one snapshot, safe through a transaction-mode pooler and on a role that can
// only read.
//
// (Not worker/routes.go, which resolves a flow's routes in the worker, in Go,
// without a database call; this package reads the routes a database holds.)
package queueroutes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// Defaults of Options.
const (
	// DefaultHeartbeatInterval is the interval of upstream's worker and of
	// package worker: a live worker updates last_heartbeat_at this often.
	DefaultHeartbeatInterval = 5 * time.Second
	// LiveHeartbeats: a worker whose last heartbeat is older than this many
	// intervals is not counted as live. A worker heartbeats between polls, a
	// poll waits up to a few seconds and a busy database delays the update:
	// six intervals tolerate that without keeping a crashed worker alive for
	// long.
	LiveHeartbeats = 6
	// GraceHeartbeats: the default --grace, in intervals. A worker deployed
	// a moment ago needs a heartbeat or two to register and poll; a message
	// older than this on a route without a live worker is not that.
	GraceHeartbeats = 4

	defaultStatementTimeout = 30 * time.Second
	defaultLockTimeout      = time.Second
)

// Options of Read. Zero values take the defaults.
type Options struct {
	// HeartbeatInterval of the workers (default 5 s). LiveWindow and Grace
	// derive from it when they are not set.
	HeartbeatInterval time.Duration
	// LiveWindow: a worker not stopped, not deprecated and with a heartbeat
	// within this window is live (default LiveHeartbeats intervals).
	LiveWindow time.Duration
	// Grace: a message in a queue for longer than this is waiting (default
	// GraceHeartbeats intervals).
	Grace time.Duration
	// StatementTimeout and LockTimeout bound the read (defaults 30 s, 1 s).
	StatementTimeout, LockTimeout time.Duration
	// ApplicationName of the read's transaction (default "pgflow-upgrade routes").
	ApplicationName string
}

func (o Options) withDefaults() Options {
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.LiveWindow <= 0 {
		o.LiveWindow = LiveHeartbeats * o.HeartbeatInterval
	}
	if o.Grace <= 0 {
		o.Grace = GraceHeartbeats * o.HeartbeatInterval
	}
	if o.StatementTimeout <= 0 {
		o.StatementTimeout = defaultStatementTimeout
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = defaultLockTimeout
	}
	if o.ApplicationName == "" {
		o.ApplicationName = "pgflow-upgrade routes"
	}
	return o
}

// Queue modes (pgflow.flows.queue_mode).
const (
	ModeFlow = "flow"
	ModeStep = "step"
)

// Worker is a live worker of a route.
type Worker struct {
	WorkerID     string `json:"worker_id"`
	FunctionName string `json:"function_name"`
	// PgflowVersion is what the worker recorded (workers.pgflow_version,
	// pgflow 0.17.1+); "" when the database does not record it.
	PgflowVersion   string    `json:"pgflow_version,omitempty"`
	StartedAt       time.Time `json:"started_at"`
	LastHeartbeatAt time.Time `json:"last_heartbeat_at"`
	// Legacy: a 0.16.0 worker, which registers and heartbeats on 0.17 but
	// fails at every claim. LegacyReason says how it is known.
	Legacy       bool   `json:"legacy"`
	LegacyReason string `json:"legacy_reason,omitempty"`
}

// Label is the worker as a person reads it: its function name, and its
// version when known.
func (w Worker) Label() string {
	switch {
	case w.PgflowVersion != "":
		return w.FunctionName + " (" + w.PgflowVersion + ")"
	case w.Legacy:
		return w.FunctionName + " (0.16.0)"
	}
	return w.FunctionName
}

// Route states.
const (
	StateOK         = "ok"          // a live worker that can claim
	StateIdle       = "idle"        // no live worker, nothing waiting
	StateNoWorker   = "no_worker"   // messages waiting, no live worker
	StateLegacyOnly = "legacy_only" // only 0.16.0 workers: every claim fails
	StateNoQueue    = "no_queue"    // the route's pgmq queue does not exist
	StateUnknown    = "unknown"     // its queue could not be read
)

// Route is one queue route: a flow-mode flow (every step on one queue) or
// one step of a step-mode flow.
type Route struct {
	Flow      string `json:"flow"`
	QueueMode string `json:"queue_mode"`
	// Step is the step a step-mode route carries; "" in flow mode, where
	// the queue carries every step.
	Step  string `json:"step,omitempty"`
	Queue string `json:"queue"`
	// QueueExists: pgmq has the queue's table.
	QueueExists bool `json:"queue_exists"`
	// Visible: messages a poll would read now; Hidden: read and not yet
	// visible again (being worked on, or waiting out a retry delay).
	Visible int64 `json:"visible"`
	Hidden  int64 `json:"hidden"`
	// OldestEnqueuedAt: the oldest message's enqueue time (nil: empty queue).
	OldestEnqueuedAt *time.Time `json:"oldest_enqueued_at"`
	// Waiting: messages in the queue for longer than the grace period, and
	// the oldest one's enqueue time.
	Waiting      int64      `json:"waiting"`
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	// Workers: the live workers registered on the route's queue.
	Workers []Worker `json:"workers"`
	State   string   `json:"state"`
	// Error: why the queue could not be read (State unknown), with its SQLSTATE.
	Error string `json:"error,omitempty"`
}

// StepLabel is the route's step, or "all steps" for a flow-mode route.
func (r Route) StepLabel() string {
	if r.Step == "" {
		return "all steps"
	}
	return r.Step
}

// OldestAge is the age of the oldest message at the time of the read (0
// for an empty queue).
func (r Route) OldestAge(at time.Time) time.Duration {
	if r.OldestEnqueuedAt == nil {
		return 0
	}
	return at.Sub(*r.OldestEnqueuedAt)
}

// Finding is a route that needs a worker deployed: what is wrong, how many
// messages wait and since when, and what to deploy.
type Finding struct {
	Flow    string     `json:"flow"`
	Step    string     `json:"step,omitempty"`
	Queue   string     `json:"queue"`
	State   string     `json:"state"`
	Waiting int64      `json:"waiting"`
	Since   *time.Time `json:"since,omitempty"`
	// Message: the problem in one sentence; Deploy: what to do about it.
	Message string `json:"message"`
	Deploy  string `json:"deploy"`
}

// Report is the result of Read.
type Report struct {
	// ReadAt is the database's now() of the read's snapshot.
	ReadAt              time.Time `json:"read_at"`
	HeartbeatIntervalMS int64     `json:"heartbeat_interval_ms"`
	LiveWindowMS        int64     `json:"live_window_ms"`
	GraceMS             int64     `json:"grace_ms"`
	// VersionsRecorded: pgflow.workers has a pgflow_version column (0.17.1+).
	VersionsRecorded bool `json:"versions_recorded"`
	// UpgradedAt: when this tool recorded the 0.17 migration as applied
	// (nil when it did not, or the role cannot read its record). A worker
	// registered before it is a 0.16.0 worker: a 0.17 worker fails its
	// first startup call on a 0.16.0 schema, before it registers.
	UpgradedAt *time.Time `json:"upgraded_at,omitempty"`
	Routes     []Route    `json:"routes"`
	// Findings: the routes verify --routes fails on.
	Findings []Finding `json:"findings"`
	// Unknown: routes whose queue could not be read.
	Unknown int `json:"unknown"`
	// LegacyBeside: routes served by 0.17 workers that still have 0.16.0
	// workers registered beside them (not a failure: the 0.17 workers
	// claim; the old ones fail every claim they try and should be stopped).
	LegacyBeside int `json:"legacy_beside"`
}

// ErrNoRoutes: schema pgflow has no persisted routes (flows.queue_mode and
// steps.queue_name are pgflow 0.17's): the database is not upgraded.
var ErrNoRoutes = errors.New("schema pgflow has no queue routes (pgflow.flows.queue_mode is missing): the database is not at pgflow 0.17")

// Read reads every route of the database behind conn, its queue and its live
// workers, in one read-only transaction, and decides which routes fail.
// An error means the answer is unknown (no privilege, a timeout): it keeps
// the *pgconn.PgError reachable, and is a *session.LostError when the
// session is gone. A queue that cannot be read makes only its route
// unknown.
func Read(ctx context.Context, conn *pgx.Conn, opts Options) (_ *Report, err error) {
	defer func() { err = session.Lost(conn, err) }()
	opts = opts.withDefaults()
	tx, err := session.BeginReadOnly(ctx, conn, opts.StatementTimeout, opts.LockTimeout, opts.ApplicationName)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rep := &Report{HeartbeatIntervalMS: opts.HeartbeatInterval.Milliseconds(), LiveWindowMS: opts.LiveWindow.Milliseconds(),
		GraceMS: opts.Grace.Milliseconds(), Routes: []Route{}, Findings: []Finding{}}

	var hasMode bool
	if err := tx.QueryRow(ctx, `
		select pg_catalog.now(),
		       exists (select from pg_catalog.pg_attribute a
		                where a.attrelid = pg_catalog.to_regclass('pgflow.flows') and a.attname = 'queue_mode' and not a.attisdropped),
		       exists (select from pg_catalog.pg_attribute a
		                where a.attrelid = pg_catalog.to_regclass('pgflow.workers') and a.attname = 'pgflow_version' and not a.attisdropped)`).
		Scan(&rep.ReadAt, &hasMode, &rep.VersionsRecorded); err != nil {
		return nil, fmt.Errorf("reading the pgflow catalog: %w", err)
	}
	if !hasMode {
		return nil, ErrNoRoutes
	}
	if rep.UpgradedAt, err = upgradedAt(ctx, tx); err != nil {
		return nil, err
	}
	if err := readRoutes(ctx, tx, rep); err != nil {
		return nil, err
	}
	for i := range rep.Routes {
		if err := readQueue(ctx, tx, &rep.Routes[i], rep.ReadAt.Add(-opts.Grace)); err != nil {
			return nil, err
		}
	}
	if err := readWorkers(ctx, tx, rep, rep.ReadAt.Add(-opts.LiveWindow)); err != nil {
		return nil, err
	}
	decide(rep)
	return rep, nil
}

// upgradedAt reads when this tool applied the 0.17 migration, from its own
// record, when the role may read it (a read-only role granted only pgflow
// and pgmq gets nil, not an error).
func upgradedAt(ctx context.Context, tx pgx.Tx) (*time.Time, error) {
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	var versions []string
	for _, m := range all {
		versions = append(versions, m.Version)
	}
	var readable bool
	if err := tx.QueryRow(ctx, `
		select coalesce(bool_and(pg_catalog.has_schema_privilege(n.oid, 'USAGE') and pg_catalog.has_table_privilege(c.oid, 'SELECT')), false)
		  from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		 where n.nspname = 'pgflow_upgrade' and c.relname = 'schema_revisions'`).Scan(&readable); err != nil {
		return nil, fmt.Errorf("looking for the upgrade's record: %w", err)
	}
	if !readable {
		return nil, nil
	}
	var at *time.Time
	if err := tx.QueryRow(ctx, `select max(applied_at) from pgflow_upgrade.schema_revisions where version = any($1::text[])`, versions).Scan(&at); err != nil {
		return nil, fmt.Errorf("reading the upgrade's record: %w", err)
	}
	return at, nil
}

// readRoutes lists the persisted routes: one per flow-mode flow (its queue is
// lower(flow_slug), the queue every one of its steps records), one per step
// of a step-mode flow, in flow then step order.
func readRoutes(ctx context.Context, tx pgx.Tx, rep *Report) error {
	rows, err := tx.Query(ctx, `
		select f.flow_slug, f.queue_mode, null::text, pg_catalog.lower(f.flow_slug), -1 as step_index
		  from pgflow.flows f
		 where f.queue_mode <> 'step'
		union all
		select s.flow_slug, f.queue_mode, s.step_slug, s.queue_name, s.step_index
		  from pgflow.steps s join pgflow.flows f on f.flow_slug = s.flow_slug
		 where f.queue_mode = 'step'
		 order by 1, 5`)
	if err != nil {
		return fmt.Errorf("reading the routes: %w", err)
	}
	var step *string
	var idx int
	var r Route
	_, err = pgx.ForEachRow(rows, []any{&r.Flow, &r.QueueMode, &step, &r.Queue, &idx}, func() error {
		x := r
		if step != nil {
			x.Step = *step
		}
		x.Workers = []Worker{}
		rep.Routes = append(rep.Routes, x)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the routes: %w", err)
	}
	return nil
}

// readQueue reads the depth of a route's queue. The queue's table is found
// in the catalog (pgmq's q_<name> in schema pgmq) and named in the query
// quoted, so a route's name is never spliced into SQL as text; a table the
// role may not read makes the route unknown instead of failing the read.
func readQueue(ctx context.Context, tx pgx.Tx, r *Route, graceCutoff time.Time) error {
	var table *string
	var readable bool
	if err := tx.QueryRow(ctx, `
		select c.relname, pg_catalog.has_table_privilege(c.oid, 'SELECT')
		  from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		 where n.nspname = 'pgmq' and c.relname = 'q_' || $1 and c.relkind in ('r', 'p')`, r.Queue).Scan(&table, &readable); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // no such table: QueueExists stays false
		}
		return fmt.Errorf("looking for the queue %s: %w", r.Queue, err)
	}
	r.QueueExists = true
	if !readable {
		r.Error = fmt.Sprintf("permission denied for table pgmq.%s (SQLSTATE 42501): grant SELECT on it to read its depth", *table)
		return nil
	}
	ident := pgx.Identifier{"pgmq", *table}.Sanitize()
	err := tx.QueryRow(ctx, `
		select count(*) filter (where vt <= pg_catalog.now()),
		       count(*) filter (where vt > pg_catalog.now()),
		       min(enqueued_at),
		       count(*) filter (where enqueued_at <= $1),
		       min(enqueued_at) filter (where enqueued_at <= $1)
		  from `+ident, graceCutoff).Scan(&r.Visible, &r.Hidden, &r.OldestEnqueuedAt, &r.Waiting, &r.WaitingSince)
	if err != nil {
		return fmt.Errorf("reading the queue %s: %w", r.Queue, err)
	}
	return nil
}

// readWorkers attaches the live workers to the routes whose queue they
// registered on.
func readWorkers(ctx context.Context, tx pgx.Tx, rep *Report, liveCutoff time.Time) error {
	version := `null::text`
	if rep.VersionsRecorded {
		version = `w.pgflow_version`
	}
	rows, err := tx.Query(ctx, `
		select w.queue_name, w.worker_id::text, w.function_name, `+version+`, w.started_at, w.last_heartbeat_at
		  from pgflow.workers w
		 where w.stopped_at is null and w.deprecated_at is null and w.last_heartbeat_at > $1
		 order by w.function_name, w.started_at, w.worker_id`, liveCutoff)
	if err != nil {
		return fmt.Errorf("reading pgflow.workers: %w", err)
	}
	byQueue := map[string][]int{}
	for i, r := range rep.Routes {
		byQueue[r.Queue] = append(byQueue[r.Queue], i)
	}
	var queue string
	var ver *string
	var w Worker
	_, err = pgx.ForEachRow(rows, []any{&queue, &w.WorkerID, &w.FunctionName, &ver, &w.StartedAt, &w.LastHeartbeatAt}, func() error {
		x := w
		if ver != nil {
			x.PgflowVersion = *ver
		}
		classify(&x, rep.UpgradedAt)
		for _, i := range byQueue[queue] {
			rep.Routes[i].Workers = append(rep.Routes[i].Workers, x)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading pgflow.workers: %w", err)
	}
	return nil
}

// classify marks a 0.16.0 worker: one that recorded an older version, or
// one registered before this tool applied the 0.17 migration (a 0.17 worker
// cannot register on 0.16.0). pgflow 0.17.0 records no version: a 0.16.0
// worker started after the upgrade of a database this tool did not upgrade
// cannot be told from a 0.17 one by what the database holds.
func classify(w *Worker, upgraded *time.Time) {
	if v := w.PgflowVersion; v != "" {
		if olderThan017(v) {
			w.Legacy, w.LegacyReason = true, "it records pgflow "+v
		}
		return
	}
	if upgraded != nil && w.StartedAt.Before(*upgraded) {
		w.Legacy, w.LegacyReason = true, "registered at "+w.StartedAt.UTC().Format(time.RFC3339)+", before the 0.17 migration was applied at "+upgraded.UTC().Format(time.RFC3339)
	}
}

// olderThan017 reads a version "0.M.P" (a leading "v" allowed) and says
// whether it is older than 0.17; anything it cannot read is not.
func olderThan017(v string) bool {
	parts := strings.Split(strings.TrimPrefix(strings.TrimSpace(v), "v"), ".")
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major == 0 && minor < 17
}

// decide sets every route's state and the report's findings.
func decide(rep *Report) {
	for i := range rep.Routes {
		r := &rep.Routes[i]
		legacy, current := 0, 0
		for _, w := range r.Workers {
			if w.Legacy {
				legacy++
			} else {
				current++
			}
		}
		switch {
		case !r.QueueExists:
			r.State = StateNoQueue
		case current > 0: // a worker that can claim: the depth does not matter
			r.State = StateOK
			if legacy > 0 {
				rep.LegacyBeside++
			}
		case legacy > 0: // every claim fails, whatever waits
			r.State = StateLegacyOnly
		case r.Error != "":
			r.State = StateUnknown
			rep.Unknown++
		case r.Waiting > 0:
			r.State = StateNoWorker
		default:
			r.State = StateIdle
		}
		if f, ok := finding(*r); ok {
			rep.Findings = append(rep.Findings, f)
		}
	}
	sort.SliceStable(rep.Findings, func(i, j int) bool {
		return rep.Findings[i].Flow < rep.Findings[j].Flow
	})
}

// finding is the route's failure, if it has one.
func finding(r Route) (Finding, bool) {
	f := Finding{Flow: r.Flow, Step: r.Step, Queue: r.Queue, State: r.State, Waiting: r.Waiting, Since: r.WaitingSince}
	where := r.Where()
	waits := "no message waits yet"
	if r.Waiting > 0 {
		waits = fmt.Sprintf("%d message(s) waiting since %s", r.Waiting, r.WaitingSince.UTC().Format(time.RFC3339))
	}
	switch r.State {
	case StateNoWorker:
		f.Message = fmt.Sprintf("%s: %s and no live worker", where, waits)
		f.Deploy = deploy(r)
	case StateLegacyOnly:
		var names []string
		for _, w := range r.Workers {
			names = append(names, w.FunctionName)
		}
		f.Message = fmt.Sprintf("%s: only 0.16.0 worker(s) (%s), which fail at every claim; %s", where, strings.Join(unique(names), ", "), waits)
		f.Deploy = deploy(r) + ", then stop the 0.16.0 worker(s)"
	case StateNoQueue:
		f.Message = fmt.Sprintf("%s: its pgmq queue does not exist, so no task of it can be sent", where)
		f.Deploy = fmt.Sprintf("restart a 0.17 worker of flow %s: its startup compile recreates a missing step queue (or run pgflow.ensure_flow_compiled for it)", r.Flow)
	default:
		return Finding{}, false
	}
	return f, true
}

// Where names the route in a sentence: "flow img, step resize, queue
// img__resize" ("all steps" in flow mode).
func (r Route) Where() string {
	step := "all steps"
	if r.Step != "" {
		step = "step " + r.Step
	}
	return fmt.Sprintf("flow %s, %s, queue %s", r.Flow, step, r.Queue)
}

// deploy says which worker serves the route.
func deploy(r Route) string {
	if r.Step == "" {
		return fmt.Sprintf("deploy a pgflow 0.17 worker for flow %s (flow mode: one worker serves every step, polling queue %s)", r.Flow, r.Queue)
	}
	return fmt.Sprintf("deploy a pgflow 0.17 worker for step %s of flow %s (step mode: polling queue %s; package worker: Config.StepSlug %q; TypeScript: withStepQueues(flow) with stepSlug %q)",
		r.Step, r.Flow, r.Queue, r.Step, r.Step)
}

func unique(xs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// Inconclusive says whether err is one of the errors that leave the answer
// unknown rather than wrong: missing privileges, a statement or lock
// timeout, a cancelled statement.
func Inconclusive(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42501", "57014", "55P03", "25P03":
			return true
		}
	}
	return false
}
