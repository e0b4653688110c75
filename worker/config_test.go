package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func noop(context.Context, *Task) (any, error) { return nil, nil }

func validConfig() Config {
	return Config{
		Flow:     Flow{Slug: "greet", Steps: []Step{{Slug: "hello"}, {Slug: "bye", DependsOn: []string{"hello"}}}},
		Handlers: map[string]HandlerFunc{"hello": noop, "bye": noop},
	}
}

func TestConfigDefaults(t *testing.T) {
	c := validConfig().withDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"BatchSize", c.BatchSize, DefaultBatchSize},
		{"Concurrency", c.Concurrency, DefaultConcurrency},
		{"VisibilityTimeout", c.VisibilityTimeout, DefaultVisibilityTimeout},
		{"PollInterval", c.PollInterval, DefaultPollInterval},
		{"MaxPollSeconds", c.MaxPollSeconds, DefaultMaxPollSeconds},
		{"HeartbeatInterval", c.HeartbeatInterval, DefaultHeartbeatInterval},
		{"ShutdownTimeout", c.ShutdownTimeout, DefaultShutdownTimeout},
		{"WriteTimeout", c.WriteTimeout, DefaultWriteTimeout},
		{"ClaimLinger", c.ClaimLinger, DefaultClaimLinger},
		{"FunctionName", c.FunctionName, "go:greet"},
		{"StartMode", c.StartMode, StartModeProcess},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	// Upstream's TypeScript worker defaults: batchSize 10, visibilityTimeout 5 s,
	// maxPollSeconds 2, pollIntervalMs 100, maxConcurrent 10, heartbeat 5 s.
	if c.BatchSize != 10 || c.VisibilityTimeout != 5*time.Second || c.MaxPollSeconds != 2 ||
		c.PollInterval != 100*time.Millisecond || c.Concurrency != 10 || c.HeartbeatInterval != 5*time.Second {
		t.Errorf("defaults differ from upstream's worker: %+v", c)
	}
	if !uuidRE.MatchString(c.WorkerID) || c.WorkerID[14] != '4' {
		t.Errorf("generated WorkerID %q is not a v4 uuid", c.WorkerID)
	}
	if c.Logger == nil {
		t.Error("Logger not defaulted")
	}
	if other := validConfig().withDefaults(); other.WorkerID == c.WorkerID {
		t.Error("two workers got the same generated id")
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"missing handler", func(c *Config) { delete(c.Handlers, "bye") }, "Handlers"},
		{"handler for unknown step", func(c *Config) { c.Handlers["nope"] = noop }, "Handlers"},
		{"bad flow slug", func(c *Config) { c.Flow.Slug = "1abc" }, "Flow.Slug"},
		{"slug run", func(c *Config) { c.Flow.Slug = "run" }, "Flow.Slug"},
		{"slug too long for a queue", func(c *Config) { c.Flow.Slug = strings.Repeat("a", 48) }, "Flow.Slug"},
		{"no steps", func(c *Config) { c.Flow.Steps = nil; c.Handlers = nil }, "Flow.Steps"},
		{"dependency on a later step", func(c *Config) { c.Flow.Steps[0].DependsOn = []string{"bye"} }, "Flow.Steps[0].DependsOn"},
		{"duplicate step", func(c *Config) { c.Flow.Steps[1].Slug = "hello"; c.Flow.Steps[1].DependsOn = nil }, "Flow.Steps[1].Slug"},
		{"map with two deps", func(c *Config) {
			c.Flow.Steps = append(c.Flow.Steps, Step{Slug: "m", Type: StepMap, DependsOn: []string{"hello", "bye"}})
			c.Handlers["m"] = noop
		}, "Flow.Steps[2].DependsOn"},
		{"bad step type", func(c *Config) { c.Flow.Steps[0].Type = "fanout" }, "Flow.Steps[0].Type"},
		{"bad policy", func(c *Config) { c.Flow.Steps[0].WhenExhausted = "ignore" }, "Flow.Steps[0].WhenExhausted"},
		{"pattern not an object", func(c *Config) { c.Flow.Steps[0].RequiredInputPattern = json.RawMessage(`[1]`) }, "Flow.Steps[0].RequiredInputPattern"},
		{"negative base delay", func(c *Config) { c.Flow.Options.BaseDelay = Int(-1) }, "Flow.Options"},
		{"zero timeout", func(c *Config) { c.Flow.Steps[1].Options.Timeout = Int(0) }, "Flow.Steps[1].Options.Timeout"},
		{"bad worker id", func(c *Config) { c.WorkerID = "worker-1" }, "WorkerID"},
		{"step slug in flow mode", func(c *Config) { c.StepSlug = "hello" }, "StepSlug"},
		{"step mode without step slug", func(c *Config) { c.Flow.QueueMode = QueueModeStep }, "StepSlug"},
		{"step mode, unknown step", func(c *Config) { c.Flow.QueueMode = QueueModeStep; c.StepSlug = "nope" }, "StepSlug"},
		{"step mode, no handler for the step", func(c *Config) {
			c.Flow.QueueMode = QueueModeStep
			c.StepSlug = "bye"
			delete(c.Handlers, "bye")
		}, "Handlers"},
		{"nil handler", func(c *Config) { c.Handlers["bye"] = nil }, "Handlers"},
		{"bad queue mode", func(c *Config) { c.Flow.QueueMode = "queue" }, "Flow.QueueMode"},
		{"bad start mode", func(c *Config) { c.StartMode = "cron" }, "StartMode"},
		{"slug with a leading underscore", func(c *Config) { c.Flow.Slug = "_greet" }, "Flow.Slug"},
		{"slug with a trailing underscore", func(c *Config) { c.Flow.Slug = "greet_" }, "Flow.Slug"},
		{"slug with a double underscore", func(c *Config) { c.Flow.Slug = "gr__eet" }, "Flow.Slug"},
		{"step slugs equal but for case", func(c *Config) {
			c.Flow.Steps[1].Slug = "HELLO"
			c.Flow.Steps[1].DependsOn = nil
			c.Handlers["HELLO"] = noop
		}, "Flow.Steps[1].Slug"},
		{"step-mode flow slug too long for any step queue", func(c *Config) {
			c.Flow.QueueMode = QueueModeStep
			c.Flow.Slug = strings.Repeat("a", 45)
			c.StepSlug = "hello"
		}, "Flow.Slug"},
		{"batch too big", func(c *Config) { c.BatchSize = 1001 }, "BatchSize"},
		{"negative concurrency", func(c *Config) { c.Concurrency = -1 }, "Concurrency"},
		{"sub-second visibility", func(c *Config) { c.VisibilityTimeout = 500 * time.Millisecond }, "VisibilityTimeout"},
		{"max poll too long", func(c *Config) { c.MaxPollSeconds = 61 }, "MaxPollSeconds"},
		{"max poll below 1", func(c *Config) { c.MaxPollSeconds = -1 }, "MaxPollSeconds"},
		{"claim linger below -1", func(c *Config) { c.ClaimLinger = -2 }, "ClaimLinger"},
		{"claim linger too long", func(c *Config) { c.ClaimLinger = time.Hour }, "ClaimLinger"},
		{"heartbeat too often", func(c *Config) { c.HeartbeatInterval = time.Millisecond }, "HeartbeatInterval"},
		{"negative shutdown timeout", func(c *Config) { c.ShutdownTimeout = -time.Second }, "ShutdownTimeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.withDefaults().validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want a *ConfigError", err)
			}
			if ce.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", ce.Field, tc.field, err)
			}
		})
	}
}

// A step-mode worker needs only its own step's handler, and may carry the
// others (one map for all of a flow's workers).
func TestStepModeHandlers(t *testing.T) {
	c := validConfig()
	c.Flow.QueueMode = QueueModeStep
	c.StepSlug = "bye"
	if err := c.withDefaults().validate(); err != nil {
		t.Errorf("all handlers: %v", err)
	}
	delete(c.Handlers, "hello")
	if err := c.withDefaults().validate(); err != nil {
		t.Errorf("only its step's handler: %v", err)
	}
}

func TestNewResolvesTheCanonicalRoute(t *testing.T) {
	pool := fakePool(t)
	w, err := New(pool, validConfig())
	if err != nil {
		t.Fatal(err)
	}
	if w.Queue() != "greet" {
		t.Errorf("flow mode queue %q, want greet", w.Queue())
	}
	c := validConfig()
	c.Flow.Slug = "Greet"
	c.Flow.QueueMode = QueueModeStep
	c.StepSlug = "bye"
	w, err = New(pool, c)
	if err != nil {
		t.Fatal(err)
	}
	if w.Queue() != "greet__bye" {
		t.Errorf("step mode queue %q, want greet__bye", w.Queue())
	}
	want := []Route{{"hello", "greet__hello"}, {"bye", "greet__bye"}}
	if got := w.Routes(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("routes %v, want %v", got, want)
	}
}

func TestNewRejectsNilPoolAndBadConfig(t *testing.T) {
	if _, err := New(nil, validConfig()); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil pool: got %v", err)
	}
}

func TestSecondsRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]int{time.Second: 1, 1500 * time.Millisecond: 2, 30 * time.Second: 30} {
		if got := seconds(d); got != want {
			t.Errorf("seconds(%s) = %d, want %d", d, got, want)
		}
	}
}

func TestMarshalOutput(t *testing.T) {
	cases := []struct {
		in   any
		want string
		err  bool
	}{
		{nil, "null", false},
		{json.RawMessage(`{"a":1}`), `{"a":1}`, false},
		{json.RawMessage(`{"a":`), "", true},
		{map[string]int{"n": 2}, `{"n":2}`, false},
		{0, "0", false}, // falsy outputs are stored as they are, not as null
		{"", `""`, false},
		{make(chan int), "", true},
	}
	for _, tc := range cases {
		got, err := marshalOutput(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("marshalOutput(%#v) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// After ClaimLinger the poll loop waits on only for slots that outcome
// writes hold, up to four recent write round trips (within WriteTimeout).
func TestWriteWaitOnlyForSlotsHeldByOutcomeWrites(t *testing.T) {
	w := &Worker{cfg: Config{ClaimLinger: 20 * time.Millisecond, WriteTimeout: time.Second}, slots: make(chan struct{}, 10)}
	hold := func(n int) {
		for range n {
			w.slots <- struct{}{}
		}
	}
	hold(6) // 2 taken by the poll loop, 4 busy
	w.pastHandler.Store(4)
	if got := w.writeWait(2); got != 0 {
		t.Errorf("no write measured yet: wait %s, want 0", got)
	}
	for range 200 {
		w.observeWrite(50 * time.Millisecond)
	}
	if got := w.writeWait(2); got < 190*time.Millisecond || got > 200*time.Millisecond {
		t.Errorf("4 busy slots all in 50ms writes: wait %s, want about 200ms", got)
	}
	w.pastHandler.Store(3)
	if got := w.writeWait(2); got != 0 {
		t.Errorf("one busy slot still in its handler: wait %s, want 0", got)
	}
	w.pastHandler.Store(4)
	if got := w.writeWait(6); got != 0 {
		t.Errorf("no other busy slot: wait %s, want 0", got)
	}
	for range 200 {
		w.observeWrite(time.Minute)
	}
	if got := w.writeWait(2); got != time.Second {
		t.Errorf("after 1m writes: wait %s, want WriteTimeout (1s)", got)
	}
}
