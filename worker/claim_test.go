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
		StepSlug: "s", TaskIndex: 3, Input: json.RawMessage(`{"x":1}`)}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"msg_id":"9007199254740993"`) {
		t.Fatalf("msg_id not written as an exact string: %s", b)
	}
	if strings.Contains(string(b), "flow_input") {
		t.Errorf("an absent flow input was written: %s", b)
	}
	var out ClaimedTask
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.MessageID != bigID || out.TaskIndex != 3 || string(out.Input) != `{"x":1}` {
		t.Fatalf("round trip changed the task: %+v", out)
	}
	// A number is refused rather than silently rounded.
	if err := json.Unmarshal([]byte(`{"msg_id":9007199254740993}`), &out); err == nil {
		t.Error("a numeric msg_id was accepted")
	}
}

func TestIDStringsAreExact(t *testing.T) {
	got := idStrings([]int64{bigID, 1<<63 - 1})
	if got[0] != "9007199254740993" || got[1] != "9223372036854775807" {
		t.Errorf("got %v", got)
	}
}
