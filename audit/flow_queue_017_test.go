package audit_test

import (
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// On 0.17.0 a flow's queues are its routes: a step-mode flow has no
// lower(flow_slug) queue and needs one per step. A missing step queue is a
// warning naming it, and saying that pgflow 0.17.0's delete_flow_and_data
// fails on that flow until the queue exists again.
func TestFlowQueueMissingOn017(t *testing.T) {
	db := oneFlow(t)
	all, err := migrations.All()
	if err != nil || len(all) == 0 {
		t.Fatalf("migrations: %v (%d files)", err, len(all))
	}
	for _, m := range all {
		db.Exec(t, m.SQL)
	}
	step := `{"slug": "%s", "stepType": "single", "dependencies": [], "whenUnmet": "skip", "whenExhausted": "fail",
		"requiredInputPattern": {"defined": false}, "forbiddenInputPattern": {"defined": false}}`
	db.Exec(t, `select pgflow.ensure_flow_compiled('Sq', '{"steps": [`+strings.ReplaceAll(step, "%s", "a")+`, `+strings.ReplaceAll(step, "%s", "b")+`]}', 'step')`)
	mustBeOK(t, only(t, db, audit.Options{}, "pgmq.flow_queue_missing"), "pgmq.flow_queue_missing")

	db.Exec(t, `select pgmq.drop_queue('sq__b')`)
	f := mustFire(t, only(t, db, audit.Options{}, "pgmq.flow_queue_missing"), "pgmq.flow_queue_missing", audit.Warning)
	if f.Count != 1 || !sampleHas(f, "flow_slug", "Sq") || !sampleHas(f, "expected_queue", "sq__b") ||
		!strings.Contains(f.Message, "delete_flow_and_data") || !strings.Contains(f.Remedy, "pgmq.create") {
		t.Fatalf("%+v", f)
	}
}
