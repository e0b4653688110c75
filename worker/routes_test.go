package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// fakePool is a pool that never connects (New does not touch the database).
func fakePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := session.OpenPool(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable", session.Options{Purpose: session.Application})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestStepQueueName(t *testing.T) {
	f40 := strings.Repeat("f", 40) // f40__0 is 43 chars: the fallback fits
	f44 := strings.Repeat("f", 44) // f44__0 is 47 chars: still fits
	f45 := strings.Repeat("f", 45) // f45__0 is 48 chars: every step refused
	cases := []struct {
		name       string
		flow, step string
		index      int
		want       string // "" means refused
		field      string
	}{
		{"readable", "Orders", "Load_Items", 0, "orders__load_items", ""},
		{"readable at exactly 47", f40, "abcde", 3, f40 + "__abcde", ""},
		{"fallback at 48", f40, "abcdef", 3, f40 + "__3", ""},
		{"fallback keeps the index", f40, strings.Repeat("s", 20), 12, f40 + "__12", ""},
		{"fallback at exactly 47", f44, "step", 0, f44 + "__0", ""},
		{"fallback too long for a two-digit index", f44, "step", 10, "", "Flow.Steps[10].Slug"},
		{"flow too long even for __0", f45, "s", 0, "", "Flow.Slug"},
		{"flow too long: refused even for a short step", f45, "a", 5, "", "Flow.Slug"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StepQueueName(tc.flow, tc.step, tc.index)
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				if len(got) > maxQueueName {
					t.Fatalf("%q is longer than %d", got, maxQueueName)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("got %q, %v; want a refusal on %s", got, err, tc.field)
			}
		})
	}
}

// In one step-mode flow, steps whose readable name fits keep it and a step
// whose name does not falls back to its index.
func TestRoutesStepModeMixesReadableAndFallback(t *testing.T) {
	flow := Flow{Slug: "Invoices_2026", QueueMode: QueueModeStep, Steps: []Step{
		{Slug: "fetch"},
		{Slug: strings.Repeat("x", 40), DependsOn: []string{"fetch"}},
		{Slug: "Send", DependsOn: []string{"fetch"}},
	}}
	got, err := flow.Routes()
	if err != nil {
		t.Fatal(err)
	}
	want := []Route{
		{"fetch", "invoices_2026__fetch"},
		{strings.Repeat("x", 40), "invoices_2026__1"},
		{"Send", "invoices_2026__send"},
	}
	if len(got) != len(want) {
		t.Fatalf("routes %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("route %d = %v, want %v", i, got[i], want[i])
		}
	}
	if err := flow.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestRoutesFlowModeIsTheLowercaseSlugForEveryStep(t *testing.T) {
	flow := Flow{Slug: "Greet_Users", Steps: []Step{{Slug: "a"}, {Slug: "b", DependsOn: []string{"a"}}}}
	got, err := flow.Routes()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (Route{"a", "greet_users"}) || got[1] != (Route{"b", "greet_users"}) {
		t.Errorf("routes %v", got)
	}
	flow.Slug = strings.Repeat("g", 48)
	if _, err := flow.Routes(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a 48-char flow queue: got %v, want a refusal", err)
	}
	flow.Slug = strings.Repeat("g", 47)
	if _, err := flow.Routes(); err != nil {
		t.Errorf("a 47-char flow queue: %v", err)
	}
}

func TestRoutesStepModeNeedsSteps(t *testing.T) {
	if _, err := (Flow{Slug: "x", QueueMode: QueueModeStep}).Routes(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("got %v", err)
	}
}

// A step-mode flow whose route cannot be named is refused by New, before any
// database call (the pool here cannot connect).
func TestNewRefusesAnUnroutableStepModeFlow(t *testing.T) {
	c := Config{
		Flow:     Flow{Slug: strings.Repeat("f", 45), QueueMode: QueueModeStep, Steps: []Step{{Slug: "a"}}},
		StepSlug: "a", Handlers: map[string]HandlerFunc{"a": noop},
	}
	_, err := New(fakePool(t), c)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Flow.Slug" {
		t.Fatalf("got %v, want a *ConfigError on Flow.Slug", err)
	}
}
