package versions

import (
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// Limits and naming rules shared by every version that persists queue
// names (0.17.0 on).
const (
	// MaxQueueNameLength is pgmq's limit on a queue name (and so on
	// lower(flow_slug) of a flow-mode flow).
	MaxQueueNameLength = 47
	// MaxSlugLength is is_valid_slug's limit on flow and step slugs.
	MaxSlugLength = 128
)

// FlowModeRoute is the queue of every step of a flow in flow mode (every
// migrated flow): lower(flow_slug). Up to 0.16.0 the queue was the slug
// itself, case included.
func FlowModeRoute(flowSlug string) string { return strings.ToLower(flowSlug) }

// Signature is a pgflow function by name and identity arguments, as
// pg_get_function_identity_arguments prints them.
type Signature struct {
	Name              string
	IdentityArguments string
}

// String reads "pgflow.start_tasks(text, bigint[], uuid)".
func (s Signature) String() string {
	return Schema + "." + s.Name + "(" + catalog.TypesOnly(s.IdentityArguments) + ")"
}

// In returns the function in c, or nil.
func (s Signature) In(c *catalog.Catalog) *catalog.Function {
	return c.Function(s.Name, s.IdentityArguments)
}

// Protocol is what a worker of a version calls: the functions upstream's
// TypeScript worker of that version calls at startup and on each poll.
type Protocol struct {
	// EnsureFlowCompiled is the startup compile call.
	EnsureFlowCompiled Signature
	// StartTasks claims the messages a poll returned.
	StartTasks Signature
	// TrackWorkerFunction registers the edge function.
	TrackWorkerFunction Signature
	// QueueIdentity: queue names are persisted (steps.queue_name,
	// step_tasks.queue_name) and a worker polls its route, not the slug.
	QueueIdentity bool
	// StepQueues: flows.queue_mode exists ('flow' | 'step').
	StepQueues bool
	// WorkerReportsVersion: the worker's registration fills workers.pgflow_version.
	WorkerReportsVersion bool
}

var (
	// The 0.16.0 worker's calls; 0.17 drops start_tasks(text, bigint[], uuid)
	// so such a worker fails at its first non-empty claim (42883).
	StartTasks016         = Signature{"start_tasks", "flow_slug text, msg_ids bigint[], worker_id uuid"}
	EnsureFlowCompiled016 = Signature{"ensure_flow_compiled", "flow_slug text, shape jsonb"}
	// The 0.17 worker's calls.
	StartTasks017         = Signature{"start_tasks", "flow_slug text, msg_ids bigint[], worker_id uuid, queue_name text, step_slug text"}
	EnsureFlowCompiled017 = Signature{"ensure_flow_compiled", "flow_slug text, shape jsonb, queue_mode text, route_map jsonb"}
	// Up to 0.15.1 the compile call took the caller's allow_data_loss flag.
	EnsureFlowCompiled014  = Signature{"ensure_flow_compiled", "flow_slug text, shape jsonb, allow_data_loss boolean"}
	TrackWorkerFunction014 = Signature{"track_worker_function", "function_name text"}
	TrackWorkerFunction015 = Signature{"track_worker_function", "function_name text, start_mode text"}
)

var (
	protocol014  = Protocol{EnsureFlowCompiled: EnsureFlowCompiled014, StartTasks: StartTasks016, TrackWorkerFunction: TrackWorkerFunction014}
	protocol015  = Protocol{EnsureFlowCompiled: EnsureFlowCompiled014, StartTasks: StartTasks016, TrackWorkerFunction: TrackWorkerFunction015}
	protocol016  = Protocol{EnsureFlowCompiled: EnsureFlowCompiled016, StartTasks: StartTasks016, TrackWorkerFunction: TrackWorkerFunction015}
	protocol0170 = Protocol{EnsureFlowCompiled: EnsureFlowCompiled017, StartTasks: StartTasks017, TrackWorkerFunction: TrackWorkerFunction015,
		QueueIdentity: true, StepQueues: true}
	protocol0171 = Protocol{EnsureFlowCompiled: EnsureFlowCompiled017, StartTasks: StartTasks017, TrackWorkerFunction: TrackWorkerFunction015,
		QueueIdentity: true, StepQueues: true, WorkerReportsVersion: true}
)
