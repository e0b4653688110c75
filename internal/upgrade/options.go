package upgrade

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// Version and Name of our migration (migrations/), recorded in the tool's own
// schema (pgflow_upgrade.schema_revisions) when apply commits it.
const (
	Version = "20261203100000"
	Name    = "pgflow_private_step_queues"
)

// Upstream pgflow's own migration to the same 0.17.0 schema: the Supabase
// ledger records this version as applied, so `supabase migration up` /
// `db push` skips the user's copy of the file.
const (
	UpstreamVersion = "20260915074120"
	UpstreamName    = "pgflow_private_step_queues"
)

// Defaults of Options (also the CLI's flag defaults).
const (
	DefaultWait        = 30 * time.Second
	DefaultLockTimeout = 2 * time.Second
	DefaultLockRetries = 5
)

// idleTimeout bounds a client that hangs inside apply's transaction (stopped
// with SIGSTOP, a frozen VM): the server ends the session and its locks go
// with it. It is just above apply's own longest pause in the transaction,
// the backoff between table-lock attempts (under 5 s, locks.go) and
// between advisory-lock polls (under 1 s); everything else in the
// transaction is statements, during which a session is not idle.
const idleTimeout = 6 * time.Second

// Options of Apply. Zero values take the defaults.
type Options struct {
	DryRun bool
	// Wait: how long to poll for the advisory lock held by another apply
	// (0: one try; the CLI's default is DefaultWait).
	Wait time.Duration
	// LockTimeout: SET LOCAL lock_timeout once the advisory lock is held;
	// bounds each table-lock attempt (and every later lock wait).
	LockTimeout time.Duration
	// LockRetries: attempts after the first before giving up on the locks.
	LockRetries int
	// Progress, if set, is told when each step starts and ends.
	Progress func(Event)
	// Preflight options (sample size, per-check timeout).
	Preflight audit.Options
	// SupabaseDir, if set, is the project's supabase/migrations folder: the
	// user's copy of upstream's 0.17.0 migration (*_pgflow_private_step_queues.sql)
	// found there is recorded as applied in supabase_migrations.schema_migrations,
	// in the same transaction. Unset: the report says which
	// `supabase migration repair` command to run.
	SupabaseDir string
	// To is the release to end at (versions.Releases, 0.17.0 or later;
	// "": upstream's newest). "0.17.0" is this tool's own hop alone.
	To string
	// PgflowMigrations is the folder holding the user's copy of upstream's
	// migration files, recognised by content (hops.go); "": SupabaseDir.
	// Without upstream's files the plan ends where this tool's own hops
	// end and the report says what the rest needs.
	PgflowMigrations string
	// TelemetryOff opts out of pgflow's telemetry job in the same
	// transaction (upstream's pgflow_telemetry.disable()) when the plan
	// reaches 0.17.1 or starts there. Unset: upstream's default.
	TelemetryOff bool
	// Verify checks the migrations' integrity (default migrations.Verify);
	// Migrations lists them (default migrations.All). Tests substitute them.
	Verify     func() error
	Migrations func() ([]migrations.Migration, error)
	// Hooks are for tests only: they run inside the transaction.
	Hooks Hooks

	// AcceptState, if set, may accept a schema state other than the 0.16.0
	// baseline as the start of the migration: `apply --online`
	// (internal/online) uses it for its final switch on the shape it
	// prepared. It runs in the transaction, under the advisory lock.
	AcceptState func(ctx context.Context, tx pgx.Tx, st versions.SchemaInfo) (bool, error)
	// BeforeCommit, if set, runs in the transaction after the post-conditions
	// (internal/online drops its progress schema there, atomically).
	BeforeCommit func(ctx context.Context, tx pgx.Tx) error
	// Quiesce, if set, runs the transaction inside internal/quiesce's
	// pause, deprecate, drain ... restore (apply --quiesce; quiesce.go).
	Quiesce *quiesce.Options
	// PGMQ, if set, is the pgmq version to update to after the pgflow
	// hops (apply --pgmq; pgmqhop.go), in the same transaction; alone when
	// pgflow has no hop to run.
	PGMQ string

	// quiesced: this transaction runs inside quiesce.Run, whose own record
	// is open; any other apply refuses on an open record (inprogress.go).
	quiesced bool
}

// Hooks let tests act at exact points of the transaction (e.g. terminate the
// backend before a given statement). A hook error aborts apply.
type Hooks struct {
	// BeforeStep runs before each named step (see Step* constants).
	BeforeStep func(ctx context.Context, pid uint32, step string) error
	// BeforeStatement runs before statement index (0-based) of migration m.
	BeforeStatement func(ctx context.Context, pid uint32, m migrations.Migration, index int, stmt string) error
}

func (o Options) withDefaults() Options {
	if o.Wait < 0 {
		o.Wait = 0
	}
	if o.LockTimeout <= 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.LockRetries < 0 {
		o.LockRetries = 0
	}
	if o.Verify == nil {
		o.Verify = migrations.Verify
	}
	if o.Migrations == nil {
		o.Migrations = migrations.All
	}
	return o
}

// Steps of apply, in order.
const (
	StepIntegrity    = "integrity"
	StepBegin        = "begin"
	StepAdvisoryLock = "advisory_lock"
	StepState        = "state"
	StepPrivileges   = "privileges"
	StepTableLocks   = "table_locks"
	StepPreflight    = "preflight"
	StepMigrate      = "migrate"
	StepPostChecks   = "post_conditions"
	StepSupabase     = "supabase_record"
	StepCommit       = "commit"
	StepRollback     = "rollback"
)

// Event is a progress notification.
type Event struct {
	Step    string
	Done    bool          // false: starting; true: finished
	Detail  string        // e.g. the statement being run
	Elapsed time.Duration // when Done
}

// StepTiming is one step of the report.
type StepTiming struct {
	Step       string `json:"step"`
	DurationMS int64  `json:"duration_ms"`
	Detail     string `json:"detail,omitempty"`
}

// StatementReport is one statement of a migration that ran.
type StatementReport struct {
	Migration  string `json:"migration"`
	Index      int    `json:"index"`
	Summary    string `json:"summary"`
	DurationMS int64  `json:"duration_ms"`
	DurationUS int64  `json:"duration_us"` // the same, finer: most statements take well under 1 ms
	Rows       int64  `json:"rows"`
}

// Report says what apply did (Result.Report), also when it failed.
type Report struct {
	DryRun bool                `json:"dry_run"`
	State  versions.SchemaInfo `json:"state_before"`
	// PgflowVersion: which pgflow apply found before it changed anything,
	// and the next step (the same object status and audit print).
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	// After a successful apply (outcome applied): the version the database
	// has now and what to do next; PgflowVersion stays what was found before.
	VersionNow string   `json:"pgflow_version_now,omitempty"`
	NextStep   string   `json:"next_step,omitempty"`
	Pending    []string `json:"pending"`
	// Unknown: revisions recorded in the database that no embedded migration has.
	Unknown    []string          `json:"unknown_revisions,omitempty"`
	Steps      []StepTiming      `json:"steps"`
	Statements []StatementReport `json:"statements"`
	// LockAttempts: how many times the table locks were tried.
	LockAttempts int `json:"lock_attempts"`
	// LockWindowMS: from the first LOCK of the successful attempt to the end
	// of commit (or rollback): how long the application was locked out.
	LockWindowMS int64 `json:"lock_window_ms"`
	// LockWaitMS: time spent in failed lock attempts (each bounded by the lock timeout).
	LockWaitMS     int64               `json:"lock_wait_ms"`
	Preflight      []audit.CheckResult `json:"preflight"`
	Blockers       []audit.Finding     `json:"blockers"`
	PostConditions []CheckOutcome      `json:"post_conditions"`
	// Plan: the hops from the release found to the one asked for.
	Plan *Plan `json:"plan,omitempty"`
	// HopsApplied: the upstream files run (HopUpstream hops), in order.
	HopsApplied []string `json:"hops_applied,omitempty"`
	// Telemetry: what this apply did about pgflow's telemetry job.
	Telemetry        string         `json:"telemetry,omitempty"`
	SupabaseRecorded bool           `json:"supabase_recorded"`
	Supabase         string         `json:"supabase,omitempty"`
	Quiesce          *QuiesceReport `json:"quiesce,omitempty"`
	// PGMQ: the pgmq hop, when apply --pgmq ran it.
	PGMQ       *PGMQReport `json:"pgmq,omitempty"`
	TotalMS    int64       `json:"total_ms"`
	BackendPID uint32      `json:"-"`

	// AutovacuumCancelled counts the autovacuum workers on pgflow tables
	// cancelled before the lock attempts (CancelAutovacuum).
	AutovacuumCancelled int `json:"autovacuum_cancelled,omitempty"`
}

// Refusal errors (exit 1): the database is unchanged.
var (
	ErrIntegrity      = errors.New("integrity check failed, refusing to run the migrations")
	ErrNotBaseline    = errors.New("the database is not the pgflow 0.16.0 baseline this migration starts from")
	ErrNewerSchema    = errors.New("the database has a newer, unknown schema revision")
	ErrPostConditions = errors.New("the post-conditions failed after the migration: rolled back, nothing was changed")
)
