package worker

import (
	"fmt"
	"strconv"
	"strings"
)

// QueueMode is a flow's queue layout (pgflow.flows.queue_mode).
type QueueMode string

const (
	// QueueModeFlow: every step of the flow on one queue, lower(flow_slug).
	// The default, and the mode of every flow migrated from 0.16.0.
	QueueModeFlow QueueMode = "flow"
	// QueueModeStep: a private queue per step (StepQueueName).
	QueueModeStep QueueMode = "step"
)

// Route says which queue carries a step's messages: one entry of the route
// map ensure_flow_compiled checks against the routes it derives itself.
type Route struct {
	StepSlug  string `json:"stepSlug"`
	QueueName string `json:"queueName"`
}

// mode returns the flow's queue mode with the default applied.
func (f Flow) mode() QueueMode {
	if f.QueueMode == "" {
		return QueueModeFlow
	}
	return f.QueueMode
}

// Routes resolves every step's queue locally, with no database call, in
// step order, by pgflow 0.17's queue naming rules:
//
//   - flow mode: every step on lower(flow_slug);
//   - step mode: StepQueueName for each step, with its 0-based index.
//
// Names are never truncated: a name pgmq could not hold refuses the flow
// (a *ConfigError). Routes does not validate slugs; Validate does (and
// calls Routes in step mode).
func (f Flow) Routes() ([]Route, error) {
	out := make([]Route, 0, len(f.Steps))
	switch f.mode() {
	case QueueModeFlow:
		q := strings.ToLower(f.Slug)
		if len(q) > maxQueueName {
			return nil, &ConfigError{Field: "Flow.Slug", Reason: fmt.Sprintf("queue name %q is longer than %d characters (pgmq's limit)", q, maxQueueName)}
		}
		for _, s := range f.Steps {
			out = append(out, Route{StepSlug: s.Slug, QueueName: q})
		}
	case QueueModeStep:
		if len(f.Steps) == 0 {
			return nil, &ConfigError{Field: "Flow.Steps", Reason: "a step-mode flow needs at least one step"}
		}
		seen := map[string]string{}
		for i, s := range f.Steps {
			q, err := StepQueueName(f.Slug, s.Slug, i)
			if err != nil {
				return nil, err
			}
			if other, ok := seen[q]; ok {
				return nil, &ConfigError{Field: fmt.Sprintf("Flow.Steps[%d].Slug", i), Reason: fmt.Sprintf("step %q would share queue %q with step %q", s.Slug, q, other)}
			}
			seen[q] = s.Slug
			out = append(out, Route{StepSlug: s.Slug, QueueName: q})
		}
	default:
		return nil, &ConfigError{Field: "Flow.QueueMode", Reason: fmt.Sprintf("%q is neither %q nor %q", f.QueueMode, QueueModeFlow, QueueModeStep)}
	}
	return out, nil
}

// StepQueueName is the private queue of a step-mode flow's step, the rule
// pgflow 0.17 applies in SQL (_resolve_step_queue_name) and in TypeScript:
//
//   - the readable name lower(flow_slug || '__' || step_slug) when it fits
//     pgmq's 47 characters;
//   - otherwise, if even lower(flow_slug || '__0') is too long, the whole
//     flow is refused;
//   - otherwise the fallback lower(flow_slug || '__' || step_index) (the
//     0-based index in step order) when it fits, else the flow is refused.
//
// A refusal is a *ConfigError; a name is never truncated or hashed.
func StepQueueName(flowSlug, stepSlug string, stepIndex int) (string, error) {
	if stepIndex < 0 {
		return "", &ConfigError{Field: "Flow.Steps", Reason: fmt.Sprintf("step index %d is negative", stepIndex)}
	}
	readable := strings.ToLower(flowSlug + "__" + stepSlug)
	if len(readable) <= maxQueueName {
		return readable, nil
	}
	if len(strings.ToLower(flowSlug+"__0")) > maxQueueName {
		return "", &ConfigError{Field: "Flow.Slug", Reason: fmt.Sprintf(
			"flow %q is too long for step queues: even %q exceeds pgmq's %d characters", flowSlug, strings.ToLower(flowSlug+"__0"), maxQueueName)}
	}
	fallback := strings.ToLower(flowSlug + "__" + strconv.Itoa(stepIndex))
	if len(fallback) > maxQueueName {
		return "", &ConfigError{Field: fmt.Sprintf("Flow.Steps[%d].Slug", stepIndex), Reason: fmt.Sprintf(
			"neither %q nor its fallback %q fits pgmq's %d characters", readable, fallback, maxQueueName)}
	}
	return fallback, nil
}

// routeOf returns the queue of one step in routes.
func routeOf(routes []Route, stepSlug string) (string, bool) {
	for _, r := range routes {
		if r.StepSlug == stepSlug {
			return r.QueueName, true
		}
	}
	return "", false
}
