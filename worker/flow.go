package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Querier is what the package-level helpers need: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx (anything with pgx's Exec, Query and QueryRow). It
// is the tool's one Querier interface, declared with its sessions.
type Querier = session.Querier

// StepType is a step's kind: one task (single) or one task per element of its
// input array (map).
type StepType string

const (
	StepSingle StepType = "single"
	StepMap    StepType = "map"
)

// Condition policies for Step.WhenUnmet and Step.WhenExhausted.
const (
	PolicyFail        = "fail"
	PolicySkip        = "skip"
	PolicySkipCascade = "skip-cascade"
)

// Int returns a pointer to v, for the optional fields of FlowOptions and
// StepOptions (where 0 is a meaningful value, e.g. BaseDelay: Int(0)).
func Int(v int) *int { return &v }

// FlowOptions are the flow-level defaults; nil means the engine's default
// (max attempts 3, base delay 5 s, timeout 60 s).
type FlowOptions struct {
	MaxAttempts *int `json:"maxAttempts,omitempty"`
	BaseDelay   *int `json:"baseDelay,omitempty"` // seconds; retry n waits floor(BaseDelay * 2^n)
	Timeout     *int `json:"timeout,omitempty"`   // seconds
}

// StepOptions override the flow options for one step; nil inherits.
type StepOptions struct {
	MaxAttempts *int `json:"maxAttempts,omitempty"`
	BaseDelay   *int `json:"baseDelay,omitempty"`
	Timeout     *int `json:"timeout,omitempty"`
	StartDelay  *int `json:"startDelay,omitempty"`
}

func (o FlowOptions) empty() bool {
	return o.MaxAttempts == nil && o.BaseDelay == nil && o.Timeout == nil
}
func (o StepOptions) empty() bool {
	return o.MaxAttempts == nil && o.BaseDelay == nil && o.Timeout == nil && o.StartDelay == nil
}

// Step is one step of a flow definition.
type Step struct {
	Slug string
	// Type defaults to StepSingle.
	Type StepType
	// DependsOn lists the slugs of earlier steps this one waits for. A map
	// step has at most one; a root map step maps over the flow input.
	DependsOn []string
	// WhenUnmet and WhenExhausted are PolicyFail, PolicySkip or
	// PolicySkipCascade; empty means the engine's default (skip / fail).
	WhenUnmet     string
	WhenExhausted string
	// RequiredInputPattern and ForbiddenInputPattern are JSON objects; nil
	// means "not defined".
	RequiredInputPattern  json.RawMessage
	ForbiddenInputPattern json.RawMessage
	Options               StepOptions
}

// Flow is a flow definition: what ensure_flow_compiled creates (or checks)
// in the database.
type Flow struct {
	Slug string
	// QueueMode is where the flow's messages live: QueueModeFlow (the
	// default, "" means it) puts every step on one queue named
	// lower(Slug); QueueModeStep gives each step its own queue (Routes), and
	// each worker then serves one step (Config.StepSlug). Like upstream's
	// withStepQueues(flow), it is part of the deployment, stored per flow by
	// ensure_flow_compiled.
	QueueMode QueueMode
	Options   FlowOptions
	Steps     []Step
}

// slugRE is pgflow 0.17's is_valid_slug pattern: a letter first, then
// letters, digits and single underscores, ending in a letter or digit (the
// `__` separator of step queue names can then never be ambiguous).
var slugRE = regexp.MustCompile(`^[A-Za-z](?:[A-Za-z0-9]|_[A-Za-z0-9])*$`)

// maxQueueName is pgmq's limit on queue names (internal/versions); a flow's
// queue is named as its slug, so it bounds flow slugs too.
const maxQueueName = versions.MaxQueueNameLength

// validSlug is pgflow.is_valid_slug of 0.17.0: 1-128 characters, not "run".
func validSlug(s string) bool {
	return len(s) >= 1 && len(s) <= 128 && slugRE.MatchString(s) && s != "run"
}

const slugRule = "1-128 chars of [A-Za-z0-9_], a letter first, a letter or digit last, no \"__\", not \"run\""

// Validate checks the definition the way the engine would, so mistakes are
// reported before anything is written.
func (f Flow) Validate() error {
	if !validSlug(f.Slug) {
		return &ConfigError{Field: "Flow.Slug", Reason: fmt.Sprintf("%q is not a valid slug (%s)", f.Slug, slugRule)}
	}
	switch f.QueueMode {
	case "", QueueModeFlow:
		if len(f.Slug) > maxQueueName {
			return &ConfigError{Field: "Flow.Slug", Reason: fmt.Sprintf("%q is longer than %d characters, pgmq's limit for the flow's queue name", f.Slug, maxQueueName)}
		}
	case QueueModeStep:
	default:
		return &ConfigError{Field: "Flow.QueueMode", Reason: fmt.Sprintf("%q is neither %q nor %q", f.QueueMode, QueueModeFlow, QueueModeStep)}
	}
	if len(f.Steps) == 0 {
		return &ConfigError{Field: "Flow.Steps", Reason: "a flow needs at least one step"}
	}
	if err := nonNegative("Flow.Options", f.Options.MaxAttempts, f.Options.BaseDelay); err != nil {
		return err
	}
	if f.Options.Timeout != nil && *f.Options.Timeout <= 0 {
		return &ConfigError{Field: "Flow.Options.Timeout", Reason: "must be positive"}
	}
	seen := map[string]bool{}
	seenLower := map[string]string{}
	for i, s := range f.Steps {
		field := fmt.Sprintf("Flow.Steps[%d]", i)
		if !validSlug(s.Slug) {
			return &ConfigError{Field: field + ".Slug", Reason: fmt.Sprintf("%q is not a valid slug (%s)", s.Slug, slugRule)}
		}
		if seen[s.Slug] {
			return &ConfigError{Field: field + ".Slug", Reason: fmt.Sprintf("duplicate step %q", s.Slug)}
		}
		// The engine keeps step slugs unique case-insensitively (and step
		// queue names are lowercase).
		if other, ok := seenLower[strings.ToLower(s.Slug)]; ok {
			return &ConfigError{Field: field + ".Slug", Reason: fmt.Sprintf("%q differs from step %q only by case", s.Slug, other)}
		}
		seenLower[strings.ToLower(s.Slug)] = s.Slug
		switch s.Type {
		case "", StepSingle, StepMap:
		default:
			return &ConfigError{Field: field + ".Type", Reason: fmt.Sprintf("%q is neither %q nor %q", s.Type, StepSingle, StepMap)}
		}
		if s.Type == StepMap && len(s.DependsOn) > 1 {
			return &ConfigError{Field: field + ".DependsOn", Reason: "a map step has at most one dependency"}
		}
		deps := map[string]bool{}
		for _, d := range s.DependsOn {
			// add_step needs its parents to exist, so they come first.
			if !seen[d] {
				return &ConfigError{Field: field + ".DependsOn", Reason: fmt.Sprintf("%q is not an earlier step", d)}
			}
			if deps[d] {
				return &ConfigError{Field: field + ".DependsOn", Reason: fmt.Sprintf("%q listed twice", d)}
			}
			deps[d] = true
		}
		for name, p := range map[string]string{"WhenUnmet": s.WhenUnmet, "WhenExhausted": s.WhenExhausted} {
			switch p {
			case "", PolicyFail, PolicySkip, PolicySkipCascade:
			default:
				return &ConfigError{Field: field + "." + name, Reason: fmt.Sprintf("%q is not fail, skip or skip-cascade", p)}
			}
		}
		for name, p := range map[string]json.RawMessage{"RequiredInputPattern": s.RequiredInputPattern, "ForbiddenInputPattern": s.ForbiddenInputPattern} {
			if p == nil {
				continue
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(p, &obj); err != nil || obj == nil {
				return &ConfigError{Field: field + "." + name, Reason: "must be a JSON object"}
			}
		}
		if err := nonNegative(field+".Options", s.Options.MaxAttempts, s.Options.BaseDelay, s.Options.StartDelay); err != nil {
			return err
		}
		if s.Options.Timeout != nil && *s.Options.Timeout <= 0 {
			return &ConfigError{Field: field + ".Options.Timeout", Reason: "must be positive"}
		}
		seen[s.Slug] = true
	}
	if f.QueueMode == QueueModeStep {
		if _, err := f.Routes(); err != nil {
			return err
		}
	}
	return nil
}

func nonNegative(field string, vs ...*int) error {
	for _, v := range vs {
		if v != nil && *v < 0 {
			return &ConfigError{Field: field, Reason: "options must not be negative"}
		}
	}
	return nil
}

// The shape document the TypeScript DSL compiles a flow to, which
// ensure_flow_compiled takes as its shape argument.
type shapeDoc struct {
	Steps   []shapeStep  `json:"steps"`
	Options *FlowOptions `json:"options,omitempty"`
}

type shapeStep struct {
	Slug                  string       `json:"slug"`
	StepType              StepType     `json:"stepType"`
	Dependencies          []string     `json:"dependencies"`
	WhenUnmet             string       `json:"whenUnmet"`
	WhenExhausted         string       `json:"whenExhausted"`
	RequiredInputPattern  shapePattern `json:"requiredInputPattern"`
	ForbiddenInputPattern shapePattern `json:"forbiddenInputPattern"`
	Options               *StepOptions `json:"options,omitempty"`
}

type shapePattern struct {
	Defined bool            `json:"defined"`
	Value   json.RawMessage `json:"value,omitempty"`
}

// Shape returns the flow's shape as the jsonb document ensure_flow_compiled
// takes: {"steps":[{"slug","stepType","dependencies","whenUnmet",
// "whenExhausted","requiredInputPattern","forbiddenInputPattern","options"?}],
// "options"?}. Defaults are written out, so the document is explicit.
func (f Flow) Shape() (json.RawMessage, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	doc := shapeDoc{Steps: make([]shapeStep, 0, len(f.Steps))}
	if !f.Options.empty() {
		o := f.Options
		doc.Options = &o
	}
	for _, s := range f.Steps {
		st := shapeStep{
			Slug:          s.Slug,
			StepType:      s.Type,
			Dependencies:  append([]string{}, s.DependsOn...),
			WhenUnmet:     s.WhenUnmet,
			WhenExhausted: s.WhenExhausted,
		}
		if st.StepType == "" {
			st.StepType = StepSingle
		}
		if st.WhenUnmet == "" {
			st.WhenUnmet = PolicySkip
		}
		if st.WhenExhausted == "" {
			st.WhenExhausted = PolicyFail
		}
		if s.RequiredInputPattern != nil {
			st.RequiredInputPattern = shapePattern{Defined: true, Value: compact(s.RequiredInputPattern)}
		}
		if s.ForbiddenInputPattern != nil {
			st.ForbiddenInputPattern = shapePattern{Defined: true, Value: compact(s.ForbiddenInputPattern)}
		}
		if !s.Options.empty() {
			o := s.Options
			st.Options = &o
		}
		doc.Steps = append(doc.Steps, st)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("encoding the shape of flow %q: %w", f.Slug, err)
	}
	return b, nil
}

func compact(raw json.RawMessage) json.RawMessage {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return raw // Validate has checked it parses
	}
	return buf.Bytes()
}
