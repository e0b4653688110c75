package worker_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// storedFlows reads every flow definition back from pgflow.steps and
// pgflow.deps (so ensure_flow_compiled verifies it), and which steps feed a
// map step (their output must be an array).
func storedFlows(t *testing.T, pool *pgxpool.Pool) ([]worker.Flow, map[string]bool) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		select s.flow_slug, s.step_slug, s.step_type, s.when_unmet, s.when_exhausted,
		       s.required_input_pattern, s.forbidden_input_pattern,
		       coalesce((select array_agg(d.dep_slug order by p.step_index) from pgflow.deps d
		                 join pgflow.steps p on p.flow_slug = d.flow_slug and p.step_slug = d.dep_slug
		                 where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug), '{}'),
		       exists (select 1 from pgflow.deps d join pgflow.steps c on c.flow_slug = d.flow_slug and c.step_slug = d.step_slug
		               where d.flow_slug = s.flow_slug and d.dep_slug = s.step_slug and c.step_type = 'map')
		from pgflow.steps s order by s.flow_slug, s.step_index`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var flows []worker.Flow
	feedsMap := map[string]bool{}
	for rows.Next() {
		var flow, step, typ, unmet, exhausted string
		var req, forb []byte
		var deps []string
		var feeds bool
		if err := rows.Scan(&flow, &step, &typ, &unmet, &exhausted, &req, &forb, &deps, &feeds); err != nil {
			t.Fatal(err)
		}
		if len(flows) == 0 || flows[len(flows)-1].Slug != flow {
			flows = append(flows, worker.Flow{Slug: flow})
		}
		f := &flows[len(flows)-1]
		s := worker.Step{Slug: step, Type: worker.StepType(typ), DependsOn: deps, WhenUnmet: unmet, WhenExhausted: exhausted}
		if req != nil {
			s.RequiredInputPattern = json.RawMessage(req)
		}
		if forb != nil {
			s.ForbiddenInputPattern = json.RawMessage(forb)
		}
		f.Steps = append(f.Steps, s)
		feedsMap[flow+"/"+step] = feeds
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return flows, feedsMap
}

// After the upgrade, workers of this package (flow mode, the mode of every
// migrated flow) finish every in-flight run of the real 0.16.0 inflight
// state, and no message is left in any flow's queue.
func TestWorkersDrainTheUpgradedInflightState(t *testing.T) {
	testdb.SkipIfShort(t, "After the upgrade, workers of this package (flow mode, the mode of every migrated...")
	t.Parallel()
	db := testdb.Empty(t)
	ctx := context.Background()
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(ctx, db.Pool); err != nil {
		t.Fatalf("loading the inflight state: %v", err)
	}
	migrate(t, db)
	open := queryInt(t, db.Pool, `select count(*) from pgflow.runs where status = 'started'`)
	failed := queryInt(t, db.Pool, `select count(*) from pgflow.runs where status = 'failed'`)
	if open < 5 {
		t.Fatalf("only %d runs in flight", open)
	}
	// Time passes: the tasks the 0.16.0 workers held are taken back by
	// requeue_stalled_tasks (as its cron would), and retry delays end.
	if _, err := db.Pool.Exec(ctx, `update pgflow.step_tasks set queued_at = queued_at - interval '1 day', started_at = started_at - interval '1 day'
		where status = 'started' and permanently_stalled_at is null`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `select pgflow.requeue_stalled_tasks()`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `select pgmq.set_vt(t.queue_name, t.message_id, 0) from pgflow.step_tasks t
		where t.status = 'queued' and t.message_id is not null`); err != nil {
		t.Fatal(err)
	}

	flows, feedsMap := storedFlows(t, db.Pool)
	ev := newEvents()
	var workers []*worker.Worker
	for _, f := range flows {
		handlers := map[string]worker.HandlerFunc{}
		for _, s := range f.Steps {
			arr := feedsMap[f.Slug+"/"+s.Slug]
			handlers[s.Slug] = func(context.Context, *worker.Task) (any, error) {
				if arr {
					return []int{0, 1}, nil
				}
				return map[string]bool{"drained": true}, nil
			}
		}
		workers = append(workers, start(t, db.Pool, worker.Config{Flow: f, Handlers: handlers, OnResult: ev.onResult}))
	}
	ev.waitUntil(t, "every in-flight run to finish", func() bool {
		return queryInt(t, db.Pool, `select count(*) from pgflow.runs where status = 'started'`) == 0
	})
	if n := queryInt(t, db.Pool, `select count(*) from pgflow.runs where status = 'failed'`); n != failed {
		t.Errorf("%d runs failed, %d before the drain", n, failed)
	}
	for _, w := range workers {
		stopNow(t, w)
		if s := w.Stats(); s.Failed != 0 || s.WriteErrors != 0 || s.ClaimErrors != 0 {
			t.Errorf("worker of %s: %+v", w.Queue(), s)
		}
		if n := queryInt(t, db.Pool, `select count(*) from `+pgx.Identifier{"pgmq", "q_" + w.Queue()}.Sanitize()); n != 0 {
			t.Errorf("%d messages left in queue %s", n, w.Queue())
		}
	}
}
