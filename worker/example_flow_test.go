package worker_test

import (
	"encoding/json"
	"fmt"

	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// A flow definition and the shape document ensure_flow_compiled receives.
func ExampleFlow_Shape() {
	flow := worker.Flow{
		Slug:    "thumbnails",
		Options: worker.FlowOptions{MaxAttempts: worker.Int(5)},
		Steps: []worker.Step{
			{Slug: "list"},
			{Slug: "resize", Type: worker.StepMap, DependsOn: []string{"list"}, Options: worker.StepOptions{Timeout: worker.Int(120)}},
		},
	}
	shape, err := flow.Shape()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(shape))
	// Output:
	// {"steps":[{"slug":"list","stepType":"single","dependencies":[],"whenUnmet":"skip","whenExhausted":"fail","requiredInputPattern":{"defined":false},"forbiddenInputPattern":{"defined":false}},{"slug":"resize","stepType":"map","dependencies":["list"],"whenUnmet":"skip","whenExhausted":"fail","requiredInputPattern":{"defined":false},"forbiddenInputPattern":{"defined":false},"options":{"timeout":120}}],"options":{"maxAttempts":5}}
}

// Message ids are strings in JSON, so no JavaScript client rounds them.
func ExampleClaimedTask() {
	t := worker.ClaimedTask{QueueName: "thumbnails", MessageID: 9007199254740993, StepSlug: "resize", TaskIndex: 2, Attempt: 1,
		Input: json.RawMessage(`"a.png"`), FlowInput: json.RawMessage(`{}`)}
	b, _ := json.Marshal(t)
	fmt.Println(string(b))
	// Output:
	// {"queue_name":"thumbnails","message_id":"9007199254740993","flow_slug":"","run_id":"","step_slug":"resize","task_index":2,"attempt":1,"input":"a.png","flow_input":{}}
}
