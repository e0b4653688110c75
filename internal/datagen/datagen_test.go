package datagen

import (
	"context"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestGenerateSmall checks the generator's output is a consistent 0.16.0
// state: the row counts asked for, unique message ids per queue, and live
// tasks whose messages are really in their queue.
func TestGenerateSmall(t *testing.T) {
	db := testdb.Baseline(t)
	ctx := context.Background()
	if _, err := Generate(ctx, db.Pool, Shape{Tasks: 5000, Flows: 2, TasksPerRun: 100, LiveRuns: 2, LiveTasksPerRun: 7}); err != nil {
		t.Fatal(err)
	}
	var finished, live, dupes, liveWithMsg int64
	q := `select count(*) filter (where status = 'completed' and step_slug = 'items'),
	             count(*) filter (where status = 'queued')
	      from pgflow.step_tasks`
	if err := db.Pool.QueryRow(ctx, q).Scan(&finished, &live); err != nil {
		t.Fatal(err)
	}
	if finished != 5000 {
		t.Fatalf("finished map tasks = %d, want 5000", finished)
	}
	// 2 flows × (2/2+1) runs × 7 tasks.
	if live != 2*2*7 {
		t.Fatalf("live queued tasks = %d, want %d", live, 2*2*7)
	}
	if err := db.Pool.QueryRow(ctx, `select count(*) from (select flow_slug, message_id from pgflow.step_tasks
	    group by 1, 2 having count(*) > 1) d`).Scan(&dupes); err != nil {
		t.Fatal(err)
	}
	if dupes != 0 {
		t.Fatalf("%d duplicate (flow, message_id) pairs", dupes)
	}
	for f := 0; f < 2; f++ {
		var n int64
		if err := db.Pool.QueryRow(ctx, `select count(*) from pgmq.read($1, 0, 1000)`, FlowSlug(f)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		liveWithMsg += n
	}
	if liveWithMsg != live {
		t.Fatalf("%d live messages in the queues, want %d", liveWithMsg, live)
	}
}
