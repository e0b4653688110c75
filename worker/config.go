package worker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"time"
)

// Task is what a handler gets: the claimed task plus the worker that runs it.
type Task struct {
	ClaimedTask
	WorkerID string
}

// DecodeInput unmarshals the task's input into v.
func (t *Task) DecodeInput(v any) error {
	if err := json.Unmarshal(t.Input, v); err != nil {
		return fmt.Errorf("decoding input of %s/%s[%d]: %w", t.RunID, t.StepSlug, t.TaskIndex, err)
	}
	return nil
}

// DecodeFlowInput unmarshals the run's input into v.
func (t *Task) DecodeFlowInput(v any) error {
	if err := json.Unmarshal(t.FlowInput, v); err != nil {
		return fmt.Errorf("decoding flow input of run %s: %w", t.RunID, err)
	}
	return nil
}

// HandlerFunc runs one task. Its output is marshalled to JSON (a
// json.RawMessage is used as is; nil is JSON null) and stored by
// complete_task; an error (or a panic) goes to fail_task, which retries the
// task with the engine's delays until its attempts are used up.
//
// ctx is cancelled when the worker stops hard (Stop's soft timeout passed, or
// Start's context was cancelled). A handler that returns because of that is
// not counted as a failure: its task is released (or, after a hard kill, left
// for its visibility timeout).
type HandlerFunc func(ctx context.Context, t *Task) (output any, err error)

// Outcome is what became of a claimed task.
type Outcome string

const (
	OutcomeCompleted Outcome = "completed" // complete_task was called
	OutcomeFailed    Outcome = "failed"    // fail_task was called (the engine retries or fails it)
	OutcomeReleased  Outcome = "released"  // release_task gave it back (shutdown)
	OutcomeAbandoned Outcome = "abandoned" // nothing was written (hard kill, or a write failed): visible again after its visibility timeout
)

// Result reports one task's outcome to Config.OnResult.
type Result struct {
	Task     ClaimedTask
	Outcome  Outcome
	Panicked bool  // the handler panicked (Outcome is OutcomeFailed)
	Err      error // the handler's error, or the error writing the outcome
}

// Defaults.
const (
	DefaultBatchSize         = 10
	DefaultConcurrency       = 10
	DefaultVisibilityTimeout = 60 * time.Second
	DefaultPollInterval      = 100 * time.Millisecond
	DefaultMaxPollSeconds    = 2
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultClaimLinger       = 20 * time.Millisecond

	// NoServerPoll as Config.MaxPollSeconds makes each claim read once.
	NoServerPoll = -1
	// NoClaimLinger as Config.ClaimLinger claims as soon as one slot is free.
	NoClaimLinger = -1
)

// Config configures a Worker. Zero values take the defaults above; New
// validates the result and reports the first problem as a *ConfigError.
type Config struct {
	// Flow is the flow this worker runs; it is created (or checked) with
	// ensure_flow_compiled at Start. Required.
	Flow Flow
	// Handlers maps every step slug of Flow to its handler. Required.
	Handlers map[string]HandlerFunc

	// Queue is the pgmq queue to claim from. Empty means the flow's
	// queue_name as recorded in pgflow.flows; when set it must match it.
	Queue string
	// WorkerID is this worker's uuid in pgflow.workers; empty generates one.
	WorkerID string
	// FunctionName is recorded in pgflow.workers.function_name; empty means
	// "go:<flow slug>".
	FunctionName string

	// BatchSize caps one claim; a claim never asks for more tasks than there
	// are free slots.
	BatchSize int
	// Concurrency is how many handlers run at once.
	Concurrency int
	// VisibilityTimeout is the lease of a claimed task, in whole seconds: if
	// the worker dies, its tasks are claimable again after it. The protocol
	// has no lease extension, so it must exceed the longest handler run: a
	// task still running when its lease ends can be claimed (and run) again
	// by another worker. The engine completes it once either way.
	VisibilityTimeout time.Duration
	// PollInterval is the wait between reads of an empty queue.
	PollInterval time.Duration
	// MaxPollSeconds is how long one claim_tasks call may wait for messages
	// (server side); 0 means DefaultMaxPollSeconds, NoServerPoll (-1) reads
	// once and waits PollInterval in the worker instead. Stop waits for a
	// claim in flight (a claim is never cut off halfway, so nothing it
	// claimed is stranded), so this bounds how long stopping takes to begin.
	MaxPollSeconds int
	// ClaimLinger is how long the claim loop, once a slot is free while other
	// handlers still run, waits for more of them to finish before it claims
	// fewer than BatchSize tasks. Every claim_tasks call has a fixed cost (a
	// pgmq read and a few statements); claiming one task per freed slot pays
	// it per task, which with short handlers costs the server more than the
	// 0.16.0 worker's whole-batch polling (BENCHMARKS.md, "worker"). A free
	// slot idles at most this long, plus, while the database is slow to take
	// outcomes, the recent complete_task round trip (up to 10x ClaimLinger
	// more: when completions queue in the database, claiming more often only
	// adds to its load). An idle worker (every slot free) claims at once. 0
	// means DefaultClaimLinger; NoClaimLinger (-1) claims as soon as one slot
	// is free.
	ClaimLinger time.Duration
	// HeartbeatInterval is how often the worker updates last_heartbeat_at and
	// checks whether it was deprecated.
	HeartbeatInterval time.Duration
	// ShutdownTimeout is Stop's soft phase: how long in-flight handlers may
	// keep running before they are cancelled and their tasks released.
	ShutdownTimeout time.Duration
	// WriteTimeout bounds each complete/fail/release call. They run on a
	// context that is not cancelled by shutdown, so finished work is never
	// lost to a cancel.
	WriteTimeout time.Duration

	// Logger receives the worker's logs; nil means slog.Default().
	Logger *slog.Logger
	// OnFatal is called (from the claim loop) for every fatal claim result,
	// after it was logged. Fatal messages are also counted in Stats.
	OnFatal func(FatalClaimError)
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
	if c.FunctionName == "" && c.Flow.Slug != "" {
		c.FunctionName = "go:" + c.Flow.Slug
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
	for _, s := range c.Flow.Steps {
		if c.Handlers[s.Slug] == nil {
			return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("no handler for step %q", s.Slug)}
		}
	}
	for slug := range c.Handlers {
		if !c.Flow.hasStep(slug) {
			return &ConfigError{Field: "Handlers", Reason: fmt.Sprintf("handler for %q, which is not a step of flow %q", slug, c.Flow.Slug)}
		}
	}
	if c.Queue != "" && (len(c.Queue) > maxQueueName || !slugRE.MatchString(c.Queue)) {
		return &ConfigError{Field: "Queue", Reason: fmt.Sprintf("%q is not a valid queue name", c.Queue)}
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
	case c.MaxPollSeconds < NoServerPoll || c.MaxPollSeconds > 60:
		return &ConfigError{Field: "MaxPollSeconds", Reason: fmt.Sprintf("%d is not between -1 and 60", c.MaxPollSeconds)}
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
