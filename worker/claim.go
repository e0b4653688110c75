package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// ClaimedTask is a task pgflow.start_tasks handed to this worker (one
// pgflow.step_task_record, plus the queue it was claimed from): started,
// its attempt counted, its message invisible for the step's timeout + 2 s.
//
// MessageID is exact: an int64 in Go and a string in JSON (a JavaScript
// number would lose precision above 2^53).
type ClaimedTask struct {
	QueueName string          `json:"queue_name"`
	MessageID int64           `json:"msg_id,string"`
	FlowSlug  string          `json:"flow_slug"`
	RunID     string          `json:"run_id"`
	StepSlug  string          `json:"step_slug"`
	TaskIndex int             `json:"task_index"`
	Input     json.RawMessage `json:"input"` // map element, {dep: output}, or {} for a root single step
	// FlowInput is the run's input as the claim carried it: set for root
	// single steps, nil (SQL NULL) otherwise; Task.LoadFlowInput reads it
	// from pgflow.runs when it is nil.
	FlowInput json.RawMessage `json:"flow_input,omitempty"`
}

// ReadParams are the arguments of pgmq.read_with_poll.
type ReadParams struct {
	Queue             string
	VisibilityTimeout time.Duration // whole seconds (rounded up), at least 1
	Qty               int
	MaxPollSeconds    int
	PollInterval      time.Duration // milliseconds
}

// ReadMessages is the worker's poll: pgmq.read_with_poll with named
// arguments. It returns the ids of the messages read (now invisible for the
// visibility timeout), in the order pgmq returned them.
func ReadMessages(ctx context.Context, db Querier, p ReadParams) ([]int64, error) {
	rows, err := db.Query(ctx,
		`select r.msg_id from pgmq.read_with_poll(queue_name => $1::text, vt => $2::integer, qty => $3::integer,
		        max_poll_seconds => $4::integer, poll_interval_ms => $5::integer) r`,
		p.Queue, seconds(p.VisibilityTimeout), p.Qty, p.MaxPollSeconds, int(p.PollInterval/time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("polling queue %q: %w", p.Queue, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("polling queue %q: %w", p.Queue, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("polling queue %q: %w", p.Queue, err)
	}
	return ids, nil
}

// StartParams are the arguments of pgflow.start_tasks.
type StartParams struct {
	FlowSlug   string
	MessageIDs []int64
	WorkerID   string // uuid
	Queue      string // the canonical route the messages were read from
	StepSlug   string // step mode only; "" is SQL NULL (flow mode)
}

// StartTasks claims the tasks of the messages read, through
// pgflow.start_tasks with named arguments (step_slug NULL in flow mode). A
// message with no claimable task returns no row; it stays invisible until
// its visibility timeout, then comes back.
func StartTasks(ctx context.Context, db Querier, p StartParams) ([]ClaimedTask, error) {
	var step *string
	if p.StepSlug != "" {
		step = &p.StepSlug
	}
	rows, err := db.Query(ctx,
		`select t.flow_slug, t.run_id::text, t.step_slug, t.input, t.msg_id, t.task_index, t.flow_input
		 from pgflow.start_tasks(flow_slug => $1::text, msg_ids => $2::bigint[], worker_id => $3::uuid,
		                         queue_name => $4::text, step_slug => $5::text) t`,
		p.FlowSlug, p.MessageIDs, p.WorkerID, p.Queue, step)
	if err != nil {
		return nil, claimErr(p, err)
	}
	defer rows.Close()
	var out []ClaimedTask
	for rows.Next() {
		var (
			t                ClaimedTask
			msgID            *int64
			index            int32
			input, flowInput []byte
		)
		if err := rows.Scan(&t.FlowSlug, &t.RunID, &t.StepSlug, &input, &msgID, &index, &flowInput); err != nil {
			return nil, claimErr(p, err)
		}
		t.QueueName = p.Queue
		if msgID != nil {
			t.MessageID = *msgID
		}
		t.TaskIndex = int(index)
		t.Input = rawJSON(input)
		if flowInput != nil {
			t.FlowInput = append(json.RawMessage(nil), flowInput...)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, claimErr(p, err)
	}
	return out, nil
}

func claimErr(p StartParams, err error) error {
	if isUndefined(err) {
		return &ProtocolMismatchError{Missing: []string{versions.StartTasks017.String()}, Err: err}
	}
	return fmt.Errorf("claiming %d messages of queue %q for flow %q: %w", len(p.MessageIDs), p.Queue, p.FlowSlug, err)
}

// rawJSON copies a scanned jsonb value (pgx reuses its buffers); SQL NULL is
// JSON null.
func rawJSON(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return append(json.RawMessage(nil), b...)
}

// seconds rounds a duration up to whole seconds (pgmq takes integers).
func seconds(d time.Duration) int {
	s := int(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}
