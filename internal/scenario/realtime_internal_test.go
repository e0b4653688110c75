package scenario

import (
	"strings"
	"testing"
)

// The check of the upgraded stream against 0.17.0's payload keys: right
// keys are counted, a missing or extra key, a wrong topic or a private
// broadcast is an error; events not in factsPayloadKeys are left to the
// comparison with 0.16.0.
func TestFactsKeys(t *testing.T) {
	const run = "00000000-0000-4000-8000-00000000f001"
	ev := func(topic, event, payload string, private bool) rtEvent {
		return rtEvent{Topic: topic, Event: event, Private: private, Payload: payload}
	}
	started := `{"event_type":"step:started","remaining_deps":0,"remaining_tasks":1,"run_id":"` + run + `","started_at":"<at>","status":"started","step_slug":"a"}`
	cascade := `{"event_type":"step:skipped","flow_slug":"f","run_id":"` + run + `","skip_reason":"condition_unmet","skipped_at":"<at>","status":"skipped","step_slug":"a"}`
	handler := `{"error_message":"x","event_type":"step:skipped","run_id":"` + run + `","skip_reason":"handler_failed","skipped_at":"<at>","status":"skipped","step_slug":"a"}`
	completed := `{"event_type":"run:completed","run_id":"` + run + `","anything":1}`
	topic := "pgflow:run:" + run
	n, err := factsKeys([]rtEvent{
		ev(topic, "step:a:started", started, false),
		ev(topic, "step:a:skipped", cascade, false),
		ev(topic, "step:a:skipped", handler, false),
		ev(topic, "run:completed", completed, false),
	})
	if err != nil || n != 3 {
		t.Fatalf("a stream as the facts say: %d checked, %v", n, err)
	}
	bad := []struct {
		name string
		e    rtEvent
		want string
	}{
		{"missing key", ev(topic, "step:a:started", strings.Replace(started, `"remaining_deps":0,`, "", 1), false), "payload keys"},
		{"extra key", ev(topic, "step:a:skipped", strings.Replace(cascade, `{`, `{"error_message":"x",`, 1), false), "payload keys"},
		{"wrong topic", ev("pgflow:run:other", "step:a:started", started, false), "topic"},
		{"private", ev(topic, "step:a:started", started, true), "private=false"},
	}
	for _, b := range bad {
		if _, err := factsKeys([]rtEvent{b.e}); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: %v, want an error with %q", b.name, err, b.want)
		}
	}
}
