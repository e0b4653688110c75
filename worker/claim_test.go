package worker

import (
	"encoding/json"
	"strings"
	"testing"
)

// 2^53 + 1: the first integer a float64 (a JavaScript number) cannot hold.
const bigID = int64(9007199254740993)

func TestClaimedTaskJSONKeepsMessageIDExact(t *testing.T) {
	in := ClaimedTask{QueueName: "q", MessageID: bigID, FlowSlug: "f", RunID: "0b3c0f8e-0000-4000-8000-000000000001",
		StepSlug: "s", TaskIndex: 3, Attempt: 2, Input: json.RawMessage(`{"x":1}`), FlowInput: json.RawMessage(`null`)}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"message_id":"9007199254740993"`) {
		t.Fatalf("message_id not written as an exact string: %s", b)
	}
	var out ClaimedTask
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.MessageID != bigID || out.TaskIndex != 3 || string(out.Input) != `{"x":1}` {
		t.Fatalf("round trip changed the task: %+v", out)
	}
	// A number is refused rather than silently rounded.
	if err := json.Unmarshal([]byte(`{"message_id":9007199254740993}`), &out); err == nil {
		t.Error("a numeric message_id was accepted")
	}
}

func TestFatalClaimErrorJSONAndMessage(t *testing.T) {
	f := FatalClaimError{QueueName: "orders", MessageID: bigID, Reason: ReasonNoTask}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"queue_name":"orders","message_id":"9007199254740993","reason":"no_task"}` {
		t.Errorf("json: %s", b)
	}
	if msg := f.Error(); !strings.Contains(msg, "9007199254740993") || !strings.Contains(msg, `"orders"`) {
		t.Errorf("error message lacks the message address: %s", msg)
	}
}
