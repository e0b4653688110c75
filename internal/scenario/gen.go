package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// GenStep is one step of a generated flow.
type GenStep struct {
	Slug string
	Type string // single | map
	Deps []string
	// FeedsMap: a map step depends on this one, so its output is an array.
	FeedsMap bool
}

// GenFlow is a generated flow.
type GenFlow struct {
	Slug  string
	Steps []GenStep
}

// Generated is what Generate built.
type Generated struct {
	Seed  uint64
	Flows []GenFlow
}

// Generate builds a random pgflow 0.16.0 state from seed, through the 0.16.0
// engine's own functions and a simulated 0.16.0 worker (pgmq.read +
// start_tasks + complete_task / fail_task), so every row is one the engine
// could have written: flows of random DAG shapes with single and map steps
// (root maps over the input, dependent maps fanning out over a parent's
// array), runs started, completed and failed, tasks queued, started,
// retried, completed, failed and stalled, messages visible, invisible
// (started, or read and never started), delayed and archived.
//
// The structure is a function of the seed; ids and timestamps are not.
func Generate(ctx context.Context, pool *pgxpool.Pool, seed uint64) (*Generated, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	gen := &generator{
		ctx:  ctx,
		conn: conn.Conn(),
		seed: seed,
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		g:    &Generated{Seed: seed},
	}
	// The random draws happen in this order, each step's after the one
	// before: changing the order changes every state a seed builds.
	steps := []func() error{gen.createFlows, gen.registerWorkers, gen.startRuns, gen.workRounds, gen.stall}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return gen.g, nil
}

// genWorkerID is the simulated 0.16.0 worker's id: the running worker row,
// and the one that starts tasks.
const genWorkerID = "00000000-0000-4000-8000-00000000a001"

// generator is one Generate call: the seed's random source and the session
// every row is written through.
type generator struct {
	ctx  context.Context
	conn *pgx.Conn
	seed uint64
	rng  *rand.Rand
	g    *Generated
}

func (gen *generator) exec(what, sql string, args ...any) error {
	if _, err := gen.conn.Exec(gen.ctx, sql, args...); err != nil {
		return fmt.Errorf("generate (seed %d): %s: %w", gen.seed, what, err)
	}
	return nil
}

// createFlows creates one to three flows of one to five steps each.
func (gen *generator) createFlows() error {
	rng := gen.rng
	nFlows := 1 + rng.IntN(3)
	for i := range nFlows {
		f := GenFlow{Slug: fmt.Sprintf("gen_%d_%s", i, randWord(rng))}
		if err := gen.exec("create_flow "+f.Slug, `select pgflow.create_flow($1, max_attempts => $2, base_delay => $3, timeout => $4)`,
			f.Slug, 1+rng.IntN(3), rng.IntN(2), 1+rng.IntN(5)); err != nil {
			return err
		}
		nSteps := 1 + rng.IntN(5)
		for j := range nSteps {
			if err := gen.addStep(&f, j); err != nil {
				return err
			}
		}
		gen.g.Flows = append(gen.g.Flows, f)
	}
	return nil
}

// addStep adds step j to f: a single step depending on any of the earlier
// ones, or a map step over the run's input or over one parent's output.
func (gen *generator) addStep(f *GenFlow, j int) error {
	rng := gen.rng
	s := GenStep{Slug: fmt.Sprintf("s%d", j), Type: "single"}
	if rng.IntN(4) == 0 {
		s.Type = "map"
	}
	if j > 0 {
		if s.Type == "map" {
			if rng.IntN(3) > 0 { // a dependent map takes exactly one parent
				s.Deps = []string{f.Steps[rng.IntN(j)].Slug}
			}
		} else {
			for _, p := range f.Steps {
				if rng.IntN(2) == 0 {
					s.Deps = append(s.Deps, p.Slug)
				}
			}
		}
	}
	exhausted := []string{"fail", "fail", "skip", "skip-cascade"}[rng.IntN(4)]
	var startDelay *int
	if rng.IntN(10) == 0 {
		d := 3600 // a delayed first message: invisible for an hour
		startDelay = &d
	}
	deps := s.Deps
	if deps == nil {
		deps = []string{}
	}
	if err := gen.exec("add_step "+f.Slug+"."+s.Slug,
		`select pgflow.add_step($1, $2, $3::text[], step_type => $4, when_exhausted => $5, start_delay => $6)`,
		f.Slug, s.Slug, deps, s.Type, exhausted, startDelay); err != nil {
		return err
	}
	if s.Type == "map" && len(s.Deps) == 1 {
		for k := range f.Steps {
			if f.Steps[k].Slug == s.Deps[0] {
				f.Steps[k].FeedsMap = true
			}
		}
	}
	f.Steps = append(f.Steps, s)
	return nil
}

// registerWorkers writes workers of every lifecycle: running, stopped,
// deprecated.
func (gen *generator) registerWorkers() error {
	flows := gen.g.Flows
	if err := gen.exec("worker", `insert into pgflow.workers (worker_id, queue_name, function_name) values ($1, $2, 'gen-worker')`, genWorkerID, flows[0].Slug); err != nil {
		return err
	}
	if err := gen.exec("worker function", `select pgflow.track_worker_function('gen-worker')`); err != nil {
		return err
	}
	if err := gen.exec("stopped worker", `insert into pgflow.workers (worker_id, queue_name, function_name, stopped_at)
		values (gen_random_uuid(), $1, 'gen-worker', now())`, flows[0].Slug); err != nil {
		return err
	}
	if gen.rng.IntN(2) == 0 {
		if err := gen.exec("deprecated worker", `insert into pgflow.workers (worker_id, queue_name, function_name, deprecated_at)
			values (gen_random_uuid(), $1, 'gen-worker', now())`, flows[len(flows)-1].Slug); err != nil {
			return err
		}
	}
	return nil
}

// startRuns starts one to five runs of each flow; a flow with a root map
// gets an array input for it to fan out over.
func (gen *generator) startRuns() error {
	rng := gen.rng
	for _, f := range gen.g.Flows {
		rootMap := false
		for _, s := range f.Steps {
			if s.Type == "map" && len(s.Deps) == 0 {
				rootMap = true
			}
		}
		nRuns := 1 + rng.IntN(5)
		for r := range nRuns {
			var input any = map[string]any{"seed": gen.seed, "run": r}
			if rootMap {
				arr := make([]int, rng.IntN(5))
				for k := range arr {
					arr[k] = k
				}
				input = arr
			}
			b, _ := json.Marshal(input)
			if err := gen.exec("start_flow "+f.Slug, `select count(*) from pgflow.start_flow($1, $2::jsonb)`, f.Slug, string(b)); err != nil {
				return err
			}
		}
	}
	return nil
}

// workRounds is the simulated 0.16.0 worker: a few rounds of read +
// start_tasks on each flow's queue.
func (gen *generator) workRounds() error {
	rounds := 1 + gen.rng.IntN(4)
	for range rounds {
		for _, f := range gen.g.Flows {
			if err := gen.work(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// work reads a few of f's messages and starts their tasks, then completes,
// fails or leaves each task started.
func (gen *generator) work(f GenFlow) error {
	rng := gen.rng
	qty := 1 + rng.IntN(6)
	ids, err := readIDs(gen.ctx, gen.conn, f.Slug, 30, qty)
	if err != nil {
		return fmt.Errorf("generate (seed %d): %w", gen.seed, err)
	}
	if len(ids) == 0 || rng.IntN(8) == 0 {
		return nil // read and never started: invisible, task still queued
	}
	tasks, err := startTasks(gen.ctx, gen.conn, f.Slug, ids, genWorkerID)
	if err != nil {
		return fmt.Errorf("generate (seed %d): %w", gen.seed, err)
	}
	for _, t := range tasks {
		switch n := rng.IntN(10); {
		case n < 5:
			out := stepOutput(f, t.step, rng.IntN(4))
			if err := gen.exec("complete_task", `select count(*) from pgflow.complete_task($1::uuid, $2, $3, $4::jsonb)`,
				t.run, t.step, t.index, out); err != nil {
				return err
			}
		case n < 7:
			if err := gen.exec("fail_task", `select count(*) from pgflow.fail_task($1::uuid, $2, $3, $4)`,
				t.run, t.step, t.index, "generated failure"); err != nil {
				return err
			}
		default: // left started: its message is invisible for timeout+2 s
		}
	}
	return nil
}

// stall makes, one time in three, a started task that the 0.16.0 cron
// requeued, or one stalled for good.
func (gen *generator) stall() error {
	rng := gen.rng
	if rng.IntN(3) != 0 {
		return nil
	}
	requeued := 0
	if rng.IntN(2) == 0 {
		requeued = 3 // the next stall is permanent
	}
	if err := gen.exec("stall", `update pgflow.step_tasks set queued_at = least(queued_at, now() - interval '1 day 1 second'),
			started_at = now() - interval '1 day', requeued_count = $1
			where ctid = (select ctid from pgflow.step_tasks where status = 'started' order by run_id, step_slug, task_index limit 1)`,
		requeued); err != nil {
		return err
	}
	return gen.exec("requeue_stalled_tasks", `select pgflow.requeue_stalled_tasks()`)
}

type startedTask struct {
	run, step string
	index     int
}

func readIDs(ctx context.Context, conn *pgx.Conn, queue string, vt, qty int) ([]int64, error) {
	rows, err := conn.Query(ctx, `select msg_id from pgmq.read($1, $2, $3)`, queue, vt, qty)
	if err != nil {
		return nil, fmt.Errorf("pgmq.read(%q): %w", queue, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("pgmq.read(%q): %w", queue, err)
	}
	return ids, nil
}

func startTasks(ctx context.Context, conn *pgx.Conn, flow string, ids []int64, workerID string) ([]startedTask, error) {
	rows, err := conn.Query(ctx, `select run_id::text, step_slug, task_index from pgflow.start_tasks($1, $2::bigint[], $3::uuid)`,
		flow, ids, workerID)
	if err != nil {
		return nil, fmt.Errorf("pgflow.start_tasks(%q): %w", flow, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (startedTask, error) {
		var t startedTask
		err := r.Scan(&t.run, &t.step, &t.index)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgflow.start_tasks(%q): %w", flow, err)
	}
	return out, nil
}

// stepOutput is a task's output: an array of n elements for a step that
// feeds a map (a map step's children get its element array anyway), an
// object otherwise.
func stepOutput(f GenFlow, step string, n int) string {
	for _, s := range f.Steps {
		if s.Slug == step && s.FeedsMap && s.Type != "map" {
			arr := make([]int, n)
			for i := range arr {
				arr[i] = i
			}
			b, _ := json.Marshal(arr)
			return string(b)
		}
	}
	return fmt.Sprintf(`{"step": %q, "n": %d}`, step, n)
}

func randWord(rng *rand.Rand) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	var b strings.Builder
	for range 6 {
		b.WriteByte(letters[rng.IntN(len(letters))])
	}
	return b.String()
}
