package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// stepJSON is one FlowShape step; deps and the type as given.
func stepJSON(slug, typ string, deps ...string) string {
	d := "[]"
	if len(deps) > 0 {
		d = `["` + strings.Join(deps, `", "`) + `"]`
	}
	return fmt.Sprintf(`{"slug": %q, "stepType": %q, "dependencies": %s, "whenUnmet": "skip", "whenExhausted": "fail",
		"requiredInputPattern": {"defined": false}, "forbiddenInputPattern": {"defined": false}}`, slug, typ, d)
}

// shapeJSON is a FlowShape of the given steps.
func shapeJSON(steps ...string) string { return `{"steps": [` + strings.Join(steps, ", ") + `]}` }

const (
	slugRule     = `Slugs are 1-128 characters of letters, digits, and single underscores, must start with a letter, cannot end with an underscore, cannot contain '__', and cannot be the reserved word 'run'.`
	missingRunID = "00000000-0000-0000-0000-000000000999"
)

// wantErr is an error as the engine must raise it, field for field.
type wantErr struct {
	code, message, detail, hint string
}

// errorCase: setup runs first (in the same transaction, rolled back after),
// then call must fail with want.
type errorCase struct {
	name        string
	setup, call string
	want        wantErr
	realPGMQ    bool // the error is the real pgmq extension's own
	// onLaterPGMQ is pgmq's own answer from 1.5.2 on, where it differs
	// from 1.5.1's (nil: the call succeeds there): upstream's engine on
	// that pgmq answers so too.
	onLaterPGMQ *wantErr
	laterPGMQ   bool // onLaterPGMQ is set (nil meaning: no error)
}

// sorted is the array literal of names sorted in the database's default
// collation, as the engine lists ambiguous queue spellings.
func sorted(t *testing.T, p *pgxpool.Pool, names ...string) string {
	return scalar[string](t, p, `select array_agg(n order by n)::text from unnest($1::text[]) n`, names)
}

func errorCases(t *testing.T, p *pgxpool.Pool) []errorCase {
	f45, f44 := strings.Repeat("f", 45), strings.Repeat("g", 44)
	var elevenSteps []string
	for i := 0; i < 11; i++ {
		elevenSteps = append(elevenSteps, stepJSON("a"+string(rune('a'+i)), "single"))
	}
	chain := func(n int) string { // a chain of n steps, each skipped for an unmet condition
		return fmt.Sprintf(`select pgflow.create_flow('chain');
			select pgflow.add_step('chain', 's' || i, case when i = 0 then '{}' else array['s' || (i - 1)] end,
			                       required_input_pattern => '{"go": true}')
			  from generate_series(0, %d) i;`, n-1)
	}
	return []errorCase{
		// Raised by the engine's own RAISE.
		{name: "E1 _cascade_force_skip_steps on a missing run",
			call: `select pgflow._cascade_force_skip_steps('` + missingRunID + `', 'x', 'r')`,
			want: wantErr{"P0001", "Run not found: " + missingRunID, "", ""}},
		{name: "E2 add_step map with more than one dependency (NULLs counted, not listed)",
			setup: `select pgflow.create_flow('f')`,
			call:  `select pgflow.add_step('f', 'Fan', array['a', null, 'b'], step_type => 'map')`,
			want:  wantErr{"P0001", `Map step "Fan" can have at most one dependency, but 3 were provided: a, b`, "", ""}},
		{name: "E2 before E3 on a step-mode flow",
			setup: `select pgflow.ensure_flow_compiled('sf', '` + shapeJSON(stepJSON("a", "single")) + `', 'step')`,
			call:  `select pgflow.add_step('sf', 'm', array['a', 'b'], step_type => 'map')`,
			want:  wantErr{"P0001", `Map step "m" can have at most one dependency, but 2 were provided: a, b`, "", ""}},
		{name: "E3 add_step on a step-mode flow",
			setup: `select pgflow.ensure_flow_compiled('sf', '` + shapeJSON(stepJSON("a", "single")) + `', 'step')`,
			call:  `select pgflow.add_step('sf', 'b')`,
			want: wantErr{"P0001", `Flow "sf" uses per-step queues: steps cannot be added incrementally.`,
				"A step-mode definition is provisioned only by complete compilation.",
				"Recompile the complete flow definition with every step instead."}},
		{name: "E4 cascade_resolve_conditions: a 51st iteration",
			setup: chain(50),
			call:  `select pgflow.start_flow('chain', '{}')`,
			want:  wantErr{"P0001", "cascade_resolve_conditions exceeded safety limit of 50 iterations", "", ""}},
		{name: "E5 create_flow over a listed queue",
			setup: `select pgmq.create('taken')`,
			call:  `select pgflow.create_flow('Taken')`,
			want:  wantErr{"23505", `cannot create flow "Taken": queue "taken" is already in use by another owner`, "", ""}},
		{name: "E6 delete_flow_and_data with an ambiguous queue",
			setup: `select pgflow.create_flow('amb');
				insert into pgmq.meta (queue_name, is_partitioned, is_unlogged) values ('AMB', false, false)`,
			call: `select pgflow.delete_flow_and_data('amb')`,
			want: wantErr{"42P09", `queue name "amb" is ambiguous: it matches listed queues ` + sorted(t, p, "AMB", "amb"), "", ""}},
		{name: "E7 a step queue routed by another flow",
			setup: `select pgflow.create_flow('other'); select pgflow.add_step('other', 's');
				update pgflow.steps set queue_name = 'shop__pay' where flow_slug = 'other'`,
			call: `select pgflow.ensure_flow_compiled('shop', '` + shapeJSON(stepJSON("pay", "single")) + `', 'step')`,
			want: wantErr{"P0001", `cannot create flow "shop": queue "shop__pay" is already used by another flow ("other")`,
				"Generated per-step queue names must belong to exactly one concrete flow.",
				"Use a different concrete flow slug, or drop the conflicting definition."}},
		{name: "E7 another flow's flow-mode queue",
			setup: `select pgflow.create_flow('other')`,
			call:  `select pgflow._assert_step_queue_available('shop', 'other')`,
			want: wantErr{"P0001", `cannot create flow "shop": queue "other" is already used by another flow ("other")`,
				"Generated per-step queue names must belong to exactly one concrete flow.",
				"Use a different concrete flow slug, or drop the conflicting definition."}},
		{name: "E8 several listed spellings",
			setup: `select pgmq.create('dup__q');
				insert into pgmq.meta (queue_name, is_partitioned, is_unlogged) values ('DUP__Q', false, false)`,
			call: `select pgflow._assert_step_queue_available('dup', 'dup__q')`,
			want: wantErr{"P0001", `queue "dup__q" matches multiple listed PGMQ queues (` + sorted(t, p, "DUP__Q", "dup__q") + `)`,
				"An ambiguous case-insensitive match is external damage.",
				"Resolve the duplicate queue spellings manually, then retry."}},
		{name: "E9 a listed queue no route owns",
			setup: `select pgmq.create('shop__pay')`,
			call:  `select pgflow.ensure_flow_compiled('shop', '` + shapeJSON(stepJSON("pay", "single")) + `', 'step')`,
			want: wantErr{"P0001", `cannot create flow "shop": queue "shop__pay" is already listed in PGMQ and not owned by this flow`,
				"A missing definition must not adopt an already listed queue.",
				"Drop the conflicting queue or use a different concrete flow slug."}},
		{name: "E9 (not E7) for a case variant of the owning flow",
			setup: `select pgflow.ensure_flow_compiled('shop', '` + shapeJSON(stepJSON("pay", "single")) + `', 'step')`,
			call:  `select pgflow._assert_step_queue_available('SHOP', 'shop__pay')`,
			want: wantErr{"P0001", `cannot create flow "SHOP": queue "shop__pay" is already listed in PGMQ and not owned by this flow`,
				"A missing definition must not adopt an already listed queue.",
				"Drop the conflicting queue or use a different concrete flow slug."}},
		{name: "E10 a flow slug too long for any step queue",
			call: `select pgflow.ensure_flow_compiled('` + f45 + `', '` + shapeJSON(stepJSON("ab", "single")) + `', 'step')`,
			want: wantErr{"P0001", `Flow "` + f45 + `" cannot use per-step queues.`,
				`The shortest required queue "` + f45 + `__0" is 48 characters; PGMQ allows at most 47.`,
				"Shorten the concrete flow slug or use the default single queue."}},
		{name: "E11 no queue name fits from index 10",
			call: `select pgflow.ensure_flow_compiled('` + f44 + `', '` + shapeJSON(elevenSteps...) + `', 'step')`,
			want: wantErr{"P0001", `Cannot derive a queue for step "ak" at index 10 in flow "` + f44 + `".`,
				"The readable name is 48 characters and the index fallback is 48; PGMQ allows at most 47.",
				"Shorten the concrete flow slug, shorten the step slug enough for the readable name, or use the default single queue."}},
		{name: "E12 unknown queue mode",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a", "single")) + `', 'Step')`,
			want: wantErr{"P0001", `Unknown queue mode "Step".`, "", "Queue mode must be 'flow' or 'step'."}},
		{name: "E13 step mode without steps",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": []}', 'step')`,
			want: wantErr{"P0001", `Flow "f" cannot use per-step queues: it has no steps.`,
				"Per-step queue mode requires at least one step.", "Add a step or keep the flow on the default single queue."}},
		{name: "E13 step mode, steps missing",
			call: `select pgflow.ensure_flow_compiled('f', '{}', 'step')`,
			want: wantErr{"P0001", `Flow "f" cannot use per-step queues: it has no steps.`,
				"Per-step queue mode requires at least one step.", "Add a step or keep the flow on the default single queue."}},
		{name: "E14 invalid flow slug",
			call: `select pgflow.ensure_flow_compiled('bad__slug', '` + shapeJSON(stepJSON("a", "single")) + `')`,
			want: wantErr{"P0001", `Flow slug "bad__slug" is not valid.`, slugRule, "Fix the flow slug in the flow definition."}},
		{name: "E15 invalid step slug",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a", "single"), stepJSON("b_", "single")) + `')`,
			want: wantErr{"P0001", `Step slug "b_" in flow "f" is not valid.`, slugRule, "Fix the step slug in the flow definition."}},
		{name: "E15 missing step slug prints <NULL>",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": [{"stepType": "single"}]}')`,
			want: wantErr{"P0001", `Step slug "<NULL>" in flow "f" is not valid.`, slugRule, "Fix the step slug in the flow definition."}},
		{name: "E15 before an earlier case collision",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("Pay", "single"), stepJSON("pay", "single"), stepJSON("_bad", "single")) + `', 'step')`,
			want: wantErr{"P0001", `Step slug "_bad" in flow "f" is not valid.`, slugRule, "Fix the step slug in the flow definition."}},
		{name: "E16 case collision",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("Pay", "single"), stepJSON("x", "single"), stepJSON("pAY", "single")) + `')`,
			want: wantErr{"P0001", `Steps "Pay" and "pAY" in flow "f" conflict case-insensitively.`,
				"Step slugs must be unique case-insensitively.", "Rename one of the colliding steps."}},
		{name: "E16 before a later queue name that does not fit",
			call: `select pgflow.ensure_flow_compiled('` + f44 + `', '` + shapeJSON(append(elevenSteps[:10:10], stepJSON("AA", "single"), elevenSteps[10])...) + `', 'step')`,
			want: wantErr{"P0001", `Steps "aa" and "AA" in flow "` + f44 + `" conflict case-insensitively.`,
				"Step slugs must be unique case-insensitively.", "Rename one of the colliding steps."}},
		{name: "E12 before E14",
			call: `select pgflow.ensure_flow_compiled('bad__slug', '` + shapeJSON(stepJSON("a", "single")) + `', 'x')`,
			want: wantErr{"P0001", `Unknown queue mode "x".`, "", "Queue mode must be 'flow' or 'step'."}},
		{name: "E13 before E14",
			call: `select pgflow.ensure_flow_compiled('bad__slug', '{"steps": []}', 'step')`,
			want: wantErr{"P0001", `Flow "bad__slug" cannot use per-step queues: it has no steps.`,
				"Per-step queue mode requires at least one step.", "Add a step or keep the flow on the default single queue."}},
		{name: "E14 before E15",
			call: `select pgflow.ensure_flow_compiled('_f', '` + shapeJSON(stepJSON("_a", "single")) + `')`,
			want: wantErr{"P0001", `Flow slug "_f" is not valid.`, slugRule, "Fix the flow slug in the flow definition."}},
		{name: "the definition before the route map",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a_", "single")) + `', 'step', '[]')`,
			want: wantErr{"P0001", `Step slug "a_" in flow "f" is not valid.`, slugRule, "Fix the step slug in the flow definition."}},
		{name: "E18 step-mode map with two dependencies",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a", "single"), stepJSON("b", "single"), stepJSON("m", "map", "a", "b")) + `', 'step')`,
			want: wantErr{"P0001", `Map step "m" can have at most one dependency, but 2 were provided: a, b`, "", ""}},
		{name: "E19 route map of another length",
			call: `select pgflow.ensure_flow_compiled('rm', '` + shapeJSON(stepJSON("a", "single"), stepJSON("b", "single")) + `', 'step', '[{"stepSlug": "a", "queueName": "rm__a"}]')`,
			want: wantErr{"P0001", `supplied route map for flow "rm" has 1 entries but 2 step(s) was derived`,
				"The route map must cover the complete ordered shape exactly.",
				"Pass withStepQueues() route snapshots or omit the map to let SQL derive it."}},
		{name: "E20 first differing entry, 1-based, a missing key printed empty",
			call: `select pgflow.ensure_flow_compiled('rm2', '` + shapeJSON(stepJSON("b", "single"), stepJSON("a", "single")) + `', 'step',
				'[{"stepSlug": "b", "queueName": "rm2__b", "extra": 1}, {"stepSlug": "a"}]')`,
			want: wantErr{"P0001", `supplied route map for flow "rm2" disagrees with the derived route at position 2`,
				"Supplied (a, ); derived (a, rm2__a).",
				"SQL derives queue names from the flow slug, step slugs, and shape order; fix the supplied map."}},
		{name: "E21 step mode without step_slug",
			setup: `select pgflow.ensure_flow_compiled('sf', '` + shapeJSON(stepJSON("a", "single")) + `', 'step')`,
			call:  `select * from pgflow.start_tasks('sf', '{1}', gen_random_uuid(), 'sf__a')`,
			want: wantErr{"P0001", `Flow "sf" uses per-step queues: an exact step_slug is required to claim tasks.`,
				`Queue "sf__a" is a private step queue; a claim without a step selector could mix steps.`,
				"Pass the exact step_slug of the polled step; direct SQL cannot obtain flow-wide claims in step mode."}},
		{name: "E22 step mode, no such route",
			setup: `select pgflow.ensure_flow_compiled('sf', '` + shapeJSON(stepJSON("a", "single")) + `', 'step')`,
			call:  `select * from pgflow.start_tasks('sf', '{1}', gen_random_uuid(), 'SF__a', 'a')`,
			want: wantErr{"P0001", `Step "a" does not route to queue "SF__a" in flow "sf".`,
				"The step selector must match a persisted step route (flow_slug, step_slug, queue_name) exactly.",
				"Poll the queue recorded for this step and pass its exact canonical name and spelling."}},
		{name: "E23 flow mode with a step selector",
			setup: `select pgflow.create_flow('ff')`,
			call:  `select * from pgflow.start_tasks('ff', '{1}', gen_random_uuid(), 'ff', 'a')`,
			want: wantErr{"P0001", `Flow "ff" uses the default flow queue: a step selector is not allowed.`,
				`Step "a" was supplied, but flow queue mode has no per-step queues.`, "Omit step_slug to claim flow-wide tasks."}},
		{name: "E24 a claimed task's message is gone",
			setup: `insert into pgflow.workers (worker_id, queue_name, function_name) values ('` + workerID + `', 'ff', 'fn');
				select pgflow.create_flow('ff'); select pgflow.add_step('ff', 'a');
				select pgflow.start_flow('ff', '{}'); select pgflow.start_flow('ff', '{}');
				select pgmq.delete('ff', (select min(msg_id) from pgmq.q_ff))`,
			call: `select * from pgflow.start_tasks('ff', (select array_agg(message_id) from pgflow.step_tasks), '` + workerID + `', 'ff')`,
			want: wantErr{"22P02", `invalid input syntax for type integer: "start_tasks(): visibility updated 1 of 2 claimed messages"`, "", ""}},

		// Surfacing from callees, casts and constraints.
		{name: "create_flow: invalid slug", call: `select pgflow.create_flow('a__b')`,
			want: wantErr{"23514", `new row for relation "flows" violates check constraint "slug_is_valid"`, "Failing row contains (a__b, 3, 5, 60, " + "%", ""}},
		{name: "create_flow: case variant of a flow (not E5)",
			setup: `select pgflow.create_flow('Orders')`, call: `select pgflow.create_flow('ORDERS')`,
			want: wantErr{"23505", `duplicate key value violates unique constraint "idx_flows_normalized_slug"`, "Key (lower(flow_slug))=(orders) already exists.", ""}},
		{name: "create_flow: flow queue name too long for pgmq",
			call: `select pgflow.create_flow('` + strings.Repeat("q", 48) + `')`,
			want: wantErr{"P0001", "queue name is too long, maximum length is 48 characters", "", ""}, realPGMQ: true,
			laterPGMQ: true, onLaterPGMQ: &wantErr{"P0001", "queue name is too long, maximum length is 47 characters", "", ""}},
		{name: "add_step: unknown dependency",
			setup: `select pgflow.create_flow('f')`, call: `select pgflow.add_step('f', 'b', array['nope'])`,
			want: wantErr{"23503", `insert or update on table "deps" violates foreign key constraint "deps_flow_slug_dep_slug_fkey"`, "Key (flow_slug, dep_slug)=(f, nope) is not present in table \"steps\".", ""}},
		{name: "step mode: a dependency on a later step",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a", "single", "b"), stepJSON("b", "single")) + `', 'step')`,
			want: wantErr{"23503", `insert or update on table "deps" violates foreign key constraint "deps_flow_slug_dep_slug_fkey"`, "Key (flow_slug, dep_slug)=(f, b) is not present in table \"steps\".", ""}},
		{name: "steps an object, flow mode",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": {}}')`,
			want: wantErr{"22023", "cannot extract elements from an object", "", ""}},
		{name: "steps an object, step mode",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": {}}', 'step')`,
			want: wantErr{"22023", "cannot get array length of a non-array", "", ""}},
		{name: "steps a scalar, step mode",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": 1}', 'step')`,
			want: wantErr{"22023", "cannot get array length of a scalar", "", ""}},
		{name: "route map an object",
			call: `select pgflow.ensure_flow_compiled('f', '` + shapeJSON(stepJSON("a", "single")) + `', 'flow', '{}')`,
			want: wantErr{"22023", "cannot get array length of a non-array", "", ""}},
		{name: "an option that is not an integer",
			call: `select pgflow.ensure_flow_compiled('f', '{"steps": [], "options": {"maxAttempts": "many"}}')`,
			want: wantErr{"22P02", `invalid input syntax for type integer: "many"`, "", ""}},
		{name: "delete_flow_and_data: a queue dropped outside pgflow",
			setup: `select pgflow.create_flow('gone'); select pgmq.drop_queue('gone')`,
			call:  `select pgflow.delete_flow_and_data('gone')`,
			want:  wantErr{"42P01", `relation "pgmq.q_gone" does not exist`, "", ""}, realPGMQ: true,
			// pgmq 1.5.2's drop_queue returns false with a NOTICE on a
			// missing queue: the deletion goes through.
			laterPGMQ: true},
	}
}

// Every error of the 0.17.0 engine, exactly: SQLSTATE, message, DETAIL and
// HINT (a DETAIL ending in % is compared up to there), and the validation
// orders where several inputs are bad. Each case runs in a transaction
// that is rolled back.
func TestErrorsAsUpstream017(t *testing.T) {
	onEachPath(t, func(t *testing.T, p *pgxpool.Pool) {
		ctx := context.Background()
		laterPGMQ := scalar[bool](t, p, `select coalesce((select pg_catalog.string_to_array(extversion, '.')::int[] > '{1,5,1}' from pg_catalog.pg_extension where extname = 'pgmq'), false)`)
		for _, c := range errorCases(t, p) {
			t.Run(c.name, func(t *testing.T) {
				if c.realPGMQ && testdb.PGMQKindInUse() != "extension" {
					t.Skip("the error is the real pgmq extension's")
				}
				if laterPGMQ && c.laterPGMQ {
					if c.onLaterPGMQ == nil {
						if _, err := p.Exec(ctx, "begin; "+c.setup+"; "+c.call+"; rollback"); err != nil {
							t.Fatalf("on pgmq after 1.5.1 %s succeeds, got %v", c.call, err)
						}
						return
					}
					c.want = *c.onLaterPGMQ
				}
				tx, err := p.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				if c.setup != "" {
					if _, err := tx.Exec(ctx, c.setup); err != nil {
						t.Fatalf("setup: %v", err)
					}
				}
				_, err = tx.Exec(ctx, c.call, pgx.QueryExecModeSimpleProtocol)
				var pe *pgconn.PgError
				if !errors.As(err, &pe) {
					t.Fatalf("%s: %v, want an error", c.call, err)
				}
				detailOK := pe.Detail == c.want.detail
				if strings.HasSuffix(c.want.detail, "%") {
					detailOK = strings.HasPrefix(pe.Detail, strings.TrimSuffix(c.want.detail, "%"))
				}
				if pe.Code != c.want.code || pe.Message != c.want.message || !detailOK || pe.Hint != c.want.hint {
					t.Errorf("got  %s %q\n     DETAIL %q\n     HINT %q\nwant %s %q\n     DETAIL %q\n     HINT %q",
						pe.Code, pe.Message, pe.Detail, pe.Hint, c.want.code, c.want.message, c.want.detail, c.want.hint)
				}
			})
		}
	})
}
