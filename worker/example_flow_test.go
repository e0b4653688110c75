package worker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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

// Flow mode (the default): every step on one queue, lower(flow slug).
func ExampleFlow_Routes_flowMode() {
	flow := worker.Flow{Slug: "Thumbnails", Steps: []worker.Step{
		{Slug: "list"},
		{Slug: "resize", Type: worker.StepMap, DependsOn: []string{"list"}},
	}}
	routes, err := flow.Routes()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range routes {
		fmt.Println(r.StepSlug, "->", r.QueueName)
	}
	// Output:
	// list -> thumbnails
	// resize -> thumbnails
}

// Step mode: a private queue per step, the readable name when it fits pgmq's
// 47 characters, else the step's index; the route map is what
// ensure_flow_compiled receives.
func ExampleFlow_Routes_stepMode() {
	flow := worker.Flow{Slug: "Thumbnails", QueueMode: worker.QueueModeStep, Steps: []worker.Step{
		{Slug: "list"},
		{Slug: "resize_every_image_to_three_sizes_then_store", Type: worker.StepMap, DependsOn: []string{"list"}},
	}}
	routes, err := flow.Routes()
	if err != nil {
		fmt.Println(err)
		return
	}
	b, _ := json.Marshal(routes)
	fmt.Println(string(b))
	// Output:
	// [{"stepSlug":"list","queueName":"thumbnails__list"},{"stepSlug":"resize_every_image_to_three_sizes_then_store","queueName":"thumbnails__1"}]
}

// A flow slug too long for even "<slug>__0" is refused in step mode: names
// are never truncated.
func ExampleStepQueueName() {
	fmt.Println(worker.StepQueueName("orders", "charge", 2))
	_, err := worker.StepQueueName(strings.Repeat("x", 45), "charge", 2)
	fmt.Println(errors.Is(err, worker.ErrInvalidConfig))
	// Output:
	// orders__charge <nil>
	// true
}

// Message ids are strings in JSON, so no JavaScript client rounds them.
func ExampleClaimedTask() {
	t := worker.ClaimedTask{QueueName: "thumbnails", MessageID: 9007199254740993, StepSlug: "resize", TaskIndex: 2,
		Input: json.RawMessage(`"a.png"`)}
	b, _ := json.Marshal(t)
	fmt.Println(string(b))
	// Output:
	// {"queue_name":"thumbnails","msg_id":"9007199254740993","flow_slug":"","run_id":"","step_slug":"resize","task_index":2,"input":"a.png"}
}
