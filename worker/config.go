package worker

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// HandlerFunc runs one task. Its output is marshalled to JSON (a
// json.RawMessage is used as is; nil is JSON null) and stored by
// complete_task; an error (or a panic) goes to fail_task with the error's
// message, and the engine retries the task with its delays until its
// attempts are used up.
//
// ctx is cancelled when the worker stops hard (Stop's soft timeout passed, or
// Start's context was cancelled). A handler that returns because of that is
// not counted as a failure: nothing is written (upstream's worker sends
// neither call on an abort), and the task comes back after its message's
// visibility timeout.
type HandlerFunc func(ctx context.Context, t *Task) (output any, err error)

// Outcome is what became of a claimed task.
type Outcome string

const (
	OutcomeCompleted Outcome = "completed" // complete_task was called
	OutcomeFailed    Outcome = "failed"    // fail_task was called (the engine retries or fails it)
	OutcomeAbandoned Outcome = "abandoned" // nothing was written (cancelled by a stop, or a write failed): visible again after its visibility timeout
)

// Result reports one task's outcome to Config.OnResult.
type Result struct {
	Task     ClaimedTask
	Outcome  Outcome
	Panicked bool  // the handler panicked (Outcome is OutcomeFailed)
	Err      error // the handler's error, or the error writing the outcome
}

// Defaults: those of upstream's TypeScript worker (batchSize,
// visibilityTimeout, maxPollSeconds, pollIntervalMs, maxConcurrent,
// heartbeat), plus this package's own.
const (
	DefaultBatchSize         = 10
	DefaultConcurrency       = 10
	DefaultVisibilityTimeout = 5 * time.Second
	DefaultPollInterval      = 100 * time.Millisecond
	DefaultMaxPollSeconds    = 2
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultClaimLinger       = 20 * time.Millisecond

	// NoClaimLinger as Config.ClaimLinger polls as soon as one slot is free.
	NoClaimLinger = -1
)

// PgflowVersion is the pgflow release whose worker protocol this package
// speaks, recorded in pgflow.workers.pgflow_version where the database has
// that column.
const PgflowVersion = "0.17.1"

// Start modes of pgflow.worker_functions.start_mode.
const (
	// StartModeProcess: a long-running process (what a Go service is);
	// pgflow's ensure_workers cron never pings it.
	StartModeProcess = "process"
	// StartModeHTTP: a function that ensure_workers may invoke over HTTP.
	StartModeHTTP = "http"
)

// Config configures a Worker. Zero values take the defaults above; New
// validates the result and reports the first problem as a *ConfigError.
type Config struct {
	// Flow is the flow this worker runs; it is created (or checked) with
	// ensure_flow_compiled at Start. Its QueueMode decides the worker's
	// route. Required.
	Flow Flow
	// StepSlug is the one step a worker of a step-mode flow serves: it
	// claims from that step's private queue. It must be empty in flow mode,
	// where a worker serves every step from lower(flow slug).
	StepSlug string
	// Handlers maps step slugs to handlers: every step of Flow in flow mode;
	// at least StepSlug in step mode (other steps of the flow may be listed,
	// so one map can serve all of a flow's workers). Required.
	Handlers map[string]HandlerFunc

	// WorkerID is this worker's uuid in pgflow.workers; empty generates one.
	WorkerID string
	// FunctionName is recorded by track_worker_function and in
	// pgflow.workers.function_name; empty means "go:<flow slug>".
	FunctionName string
	// PgflowVersion is recorded in pgflow.workers.pgflow_version at
	// registration, as upstream's 0.17.1 worker records its version, where
	// the column exists (pgflow 0.17.1 and later; on 0.17.0 the worker
	// registers without it). Empty means PgflowVersion, the release whose
	// protocol this package speaks.
	PgflowVersion string
	// StartMode is worker_functions.start_mode: StartModeProcess (the
	// default: the worker calls track_worker_function(name, 'process')) or
	// StartModeHTTP (track_worker_function(name)).
	StartMode string

	// BatchSize caps one poll; a poll never asks for more messages than
	// there are free slots.
	BatchSize int
	// Concurrency is how many handlers run at once (upstream's
	// maxConcurrent).
	Concurrency int
	// VisibilityTimeout is the vt of pgmq.read_with_poll, in whole seconds:
	// how long a message read but not claimed stays invisible. A claimed
	// task's message is then hidden for its step's timeout + 2 s by
	// start_tasks.
	VisibilityTimeout time.Duration
	// PollInterval is the wait between reads inside one read_with_poll.
	PollInterval time.Duration
	// MaxPollSeconds is how long one read_with_poll may wait for messages
	// (server side), 1 to 60. A stop cancels a poll in flight (messages it
	// read but nobody claimed come back after VisibilityTimeout).
	MaxPollSeconds int
	// ClaimLinger is how long the poll loop, once a slot is free while other
	// handlers still run, waits for more of them to finish before it polls
	// for fewer than BatchSize messages. Every poll + start_tasks pair has a
	// fixed cost; polling one message per freed slot pays it per task, which
	// with short handlers costs the server more than whole-batch polling
	// (BENCHMARKS.md, "worker"). A free slot idles at most this long while
	// any other slot is held by a running handler. When every other busy
	// slot is held only by its task's outcome write (complete_task or
	// fail_task in flight: the database is what is slow), the loop waits on
	// for up to four times the recent write round trip (at most WriteTimeout),
	// since those slots free as soon as the database answers. An idle worker
	// (every slot free) polls at once. 0 means DefaultClaimLinger;
	// NoClaimLinger (-1) polls as soon as one slot is free.
	ClaimLinger time.Duration
	// HeartbeatInterval is how often the worker updates last_heartbeat_at and
	// checks whether it was deprecated.
	HeartbeatInterval time.Duration
	// ShutdownTimeout is Stop's soft phase: how long in-flight handlers may
	// keep running before their contexts are cancelled.
	ShutdownTimeout time.Duration
	// WriteTimeout bounds each complete_task / fail_task /
	// mark_worker_stopped call. They run on a context that is not cancelled
	// by a stop, so finished work is never lost to a cancel.
	WriteTimeout time.Duration

	// Logger receives the worker's logs; nil means slog.Default().
	Logger *slog.Logger
	// OnResult is called after each task's outcome was written (from the
	// task's goroutine; keep it quick).
	OnResult func(Result)
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// withDefaults returns a copy with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.VisibilityTimeout == 0 {
		c.VisibilityTimeout = DefaultVisibilityTimeout
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MaxPollSeconds == 0 {
		c.MaxPollSeconds = DefaultMaxPollSeconds
	}
	if c.ClaimLinger == 0 {
		c.ClaimLinger = DefaultClaimLinger
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.WorkerID == "" {
		c.WorkerID = newUUID()
	}
	if c.PgflowVersion == "" {
		c.PgflowVersion = PgflowVersion
	}
	if c.FunctionName == "" && c.Flow.Slug != "" {
		c.FunctionName = "go:" + c.Flow.Slug
	}
	if c.StartMode == "" {
		c.StartMode = StartModeProcess
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate checks a config after withDefaults.
func (c Config) validate() error {
	if err := c.Flow.Validate(); err != nil {
		return err
	}
	switch c.Flow.mode() {
	case QueueModeFlow:
		if c.StepSlug != "" {
			return &ConfigError{Field: "StepSlug", Reason: fmt.Sprintf("flow %q is in flow mode: its workers serve every step from one queue, so StepSlug must be empty", c.Flow.Slug)}
		}
		for _, s := range c.Flow.Steps {
			if c.Handlers[s.Slug] == nil {
				return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("no handler for step %q", s.Slug)}
			}
		}
	case QueueModeStep:
		if c.StepSlug == "" {
			return &ConfigError{Field: "StepSlug", Reason: fmt.Sprintf("flow %q is in step mode: name the step this worker serves", c.Flow.Slug)}
		}
		if !c.Flow.hasStep(c.StepSlug) {
			return &ConfigError{Field: "StepSlug", Reason: fmt.Sprintf("%q is not a step of flow %q", c.StepSlug, c.Flow.Slug)}
		}
		if c.Handlers[c.StepSlug] == nil {
			return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("no handler for step %q", c.StepSlug)}
		}
	}
	for slug, h := range c.Handlers {
		if !c.Flow.hasStep(slug) {
			return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("handler for %q, which is not a step of flow %q", slug, c.Flow.Slug)}
		}
		if h == nil {
			return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("nil handler for step %q", slug)}
		}
	}
	if c.StartMode != StartModeProcess && c.StartMode != StartModeHTTP {
		return &ConfigError{Field: "StartMode", Reason: fmt.Sprintf("%q is neither %q nor %q", c.StartMode, StartModeProcess, StartModeHTTP)}
	}
	if c.FunctionName == "" {
		return &ConfigError{Field: "FunctionName", Reason: "is empty"}
	}
	if !uuidRE.MatchString(c.WorkerID) {
		return &ConfigError{Field: "WorkerID", Reason: fmt.Sprintf("%q is not a uuid", c.WorkerID)}
	}
	switch {
	case c.BatchSize < 1 || c.BatchSize > 1000:
		return &ConfigError{Field: "BatchSize", Reason: fmt.Sprintf("%d is not between 1 and 1000", c.BatchSize)}
	case c.Concurrency < 1 || c.Concurrency > 10000:
		return &ConfigError{Field: "Concurrency", Reason: fmt.Sprintf("%d is not between 1 and 10000", c.Concurrency)}
	case c.VisibilityTimeout < time.Second:
		return &ConfigError{Field: "VisibilityTimeout", Reason: fmt.Sprintf("%s is less than 1s", c.VisibilityTimeout)}
	case c.PollInterval < time.Millisecond:
		return &ConfigError{Field: "PollInterval", Reason: fmt.Sprintf("%s is less than 1ms", c.PollInterval)}
	case c.MaxPollSeconds < 1 || c.MaxPollSeconds > 60:
		// read_with_poll with 0 seconds returns nothing at all.
		return &ConfigError{Field: "MaxPollSeconds", Reason: fmt.Sprintf("%d is not between 1 and 60", c.MaxPollSeconds)}
	case c.ClaimLinger < NoClaimLinger || c.ClaimLinger > time.Minute:
		return &ConfigError{Field: "ClaimLinger", Reason: fmt.Sprintf("%s is negative (NoClaimLinger disables it) or longer than 1m", c.ClaimLinger)}
	case c.HeartbeatInterval < 10*time.Millisecond:
		return &ConfigError{Field: "HeartbeatInterval", Reason: fmt.Sprintf("%s is less than 10ms", c.HeartbeatInterval)}
	case c.ShutdownTimeout < 0:
		return &ConfigError{Field: "ShutdownTimeout", Reason: "must not be negative"}
	case c.WriteTimeout < 0:
		return &ConfigError{Field: "WriteTimeout", Reason: "must not be negative"}
	}
	return nil
}

func (f Flow) hasStep(slug string) bool {
	for _, s := range f.Steps {
		if s.Slug == slug {
			return true
		}
	}
	return false
}

// newUUID returns a random (version 4) uuid.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
