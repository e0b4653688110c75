package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// ClaimedTask is a task claim_tasks handed to this worker: started, with its
// attempt counted, its message invisible for the visibility timeout.
//
// MessageID is exact: an int64 in Go and a string in JSON (a JavaScript
// number would lose precision above 2^53).
type ClaimedTask struct {
	QueueName string          `json:"queue_name"`
	MessageID int64           `json:"message_id,string"`
	FlowSlug  string          `json:"flow_slug"`
	RunID     string          `json:"run_id"`
	StepSlug  string          `json:"step_slug"`
	TaskIndex int             `json:"task_index"`
	Attempt   int             `json:"attempt"` // 1 on the first try
	Input     json.RawMessage `json:"input"`   // map element, {dep: output}, or the flow input for a root single step
	FlowInput json.RawMessage `json:"flow_input"`
}

// Fatal claim reasons.
const (
	ReasonNoTask     = "no_task"     // a message with no task
	ReasonWrongRoute = "wrong_route" // a message routed to the wrong flow
	ReasonWrongWork  = "wrong_work"  // a message whose body names different work
)

// FatalClaimError is a message claim_tasks refused to hand out. The message
// stays in its queue, invisible for the visibility timeout; an operator has
// to look at it (`pgflow-upgrade audit`). It is an error value so it can be
// logged and returned, and it carries the message's exact address.
type FatalClaimError struct {
	QueueName string `json:"queue_name"`
	MessageID int64  `json:"message_id,string"`
	Reason    string `json:"reason"`
}

func (e *FatalClaimError) Error() string {
	return fmt.Sprintf("fatal claim: message %d in queue %q: %s", e.MessageID, e.QueueName, e.Reason)
}

// ClaimParams are the arguments of pgflow.claim_tasks.
type ClaimParams struct {
	Queue             string
	WorkerID          string // uuid
	BatchSize         int
	VisibilityTimeout time.Duration // whole seconds, at least 1
	MaxPollSeconds    int           // 0: read once, do not wait
	PollInterval      time.Duration // between reads while polling
}

// Claim calls pgflow.claim_tasks once and returns its typed result: claimed
// tasks, or fatal messages (one call returns one kind only).
func Claim(ctx context.Context, db Querier, p ClaimParams) ([]ClaimedTask, []FatalClaimError, error) {
	rows, err := db.Query(ctx,
		`select c.kind, c.queue_name, c.message_id, c.flow_slug, c.run_id::text, c.step_slug,
		        c.task_index, c.attempt, c.input, c.flow_input, c.reason
		 from pgflow.claim_tasks($1::text, $2::uuid, $3::integer, $4::integer, $5::integer, $6::integer) c`,
		p.Queue, p.WorkerID, p.BatchSize, seconds(p.VisibilityTimeout), p.MaxPollSeconds, int(p.PollInterval/time.Millisecond))
	if err != nil {
		return nil, nil, claimErr(p.Queue, err)
	}
	defer rows.Close()
	var claimed []ClaimedTask
	var fatal []FatalClaimError
	for rows.Next() {
		var (
			kind                           string
			queue, flow, run, step, reason *string
			msgID                          *int64
			index, attempt                 *int32
			input, flowInput               []byte
		)
		if err := rows.Scan(&kind, &queue, &msgID, &flow, &run, &step, &index, &attempt, &input, &flowInput, &reason); err != nil {
			return nil, nil, claimErr(p.Queue, err)
		}
		switch kind {
		case "claimed":
			claimed = append(claimed, ClaimedTask{
				QueueName: deref(queue), MessageID: deref(msgID), FlowSlug: deref(flow), RunID: deref(run),
				StepSlug: deref(step), TaskIndex: int(deref(index)), Attempt: int(deref(attempt)),
				Input: rawJSON(input), FlowInput: rawJSON(flowInput),
			})
		case "fatal":
			fatal = append(fatal, FatalClaimError{QueueName: deref(queue), MessageID: deref(msgID), Reason: deref(reason)})
		default:
			return nil, nil, fmt.Errorf("claiming tasks from queue %q: unknown claim_result kind %q", p.Queue, kind)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, claimErr(p.Queue, err)
	}
	return claimed, fatal, nil
}

func claimErr(queue string, err error) error {
	if isUndefined(err) {
		return &ProtocolMismatchError{Want: ProtocolVersion, Missing: []string{"pgflow.claim_tasks(text,uuid,integer,integer,integer,integer)"}, Err: err}
	}
	return fmt.Errorf("claiming tasks from queue %q: %w", queue, err)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// rawJSON copies a scanned jsonb value (pgx reuses its buffers); SQL NULL is
// JSON null.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return append(json.RawMessage(nil), b...)
}

// seconds rounds a duration up to whole seconds (claim_tasks takes integers).
func seconds(d time.Duration) int {
	s := int(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}
