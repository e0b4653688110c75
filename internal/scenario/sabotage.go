package scenario

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// A sabotage turns a valid 0.16.0 state into a malformed one.
type sabotage struct {
	what  string
	sql   string
	check string // the audit check that must be among apply's blockers
}

var (
	sabotageCaseAliases     = sabotage{"case-only slug aliases", `select pgflow.create_flow('Legacy'); select pgflow.add_step('Legacy', 'a')`, "flows.case_alias"}
	sabotageStepCaseAliases = sabotage{"case-only step slug aliases", `select pgflow.add_step('legacy', 'A')`, "steps.case_alias"}
	sabotageStrictSlug      = sabotage{"slug 0.17.0 rejects", `select pgflow.add_step('legacy', 'a__b')`, "slugs.strict_rule"}
	// pgmq refuses such a queue, so only rows written directly have it (with
	// a step: a stepless long-slug flow is only a warning).
	sabotageLongQueueName = sabotage{"queue name over 47 characters",
		`insert into pgflow.flows (flow_slug) values ('legacy_` + strings.Repeat("x", 41) + `');
		 insert into pgflow.steps (flow_slug, step_slug) values ('legacy_` + strings.Repeat("x", 41) + `', 's')`, "flows.queue_name_too_long"}
	// Two tasks of one queue carrying the same message id: only a direct
	// write (or a restore gone wrong) makes one; the unique index on
	// (queue_name, message_id) cannot be built.
	sabotageDuplicateMessageID = sabotage{"duplicate (queue, message id)",
		`update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks where flow_slug = 'legacy')
		  where flow_slug = 'legacy' and task_index = 0`, "tasks.duplicate_message_id"}
)

// malformed: a valid state, then the sabotage; apply must refuse and leave
// the database exactly as it was.
func malformed(s sabotage) func(context.Context, *Env) error {
	return func(ctx context.Context, env *Env) error {
		db, err := env.NewDB(ctx)
		if err != nil {
			return err
		}
		if err := startLegacy(ctx, db, 3); err != nil {
			return err
		}
		if _, err := db.Pool.Exec(ctx, s.sql); err != nil {
			return fmt.Errorf("making the state malformed (%s): %w", s.what, err)
		}
		before, err := fingerprint.Take(ctx, db.Pool)
		if err != nil {
			return err
		}
		rep, err := env.Upgrade(ctx, db)
		if err == nil {
			return errorf("apply accepted a database with a %s", s.what)
		}
		// Refused for this reason: the preflight (or the migration's own
		// guard, a RAISE), not integrity, state detection or a lock.
		if !errors.Is(err, upgrade.ErrPreflight) && SQLState(err) != "P0001" {
			return fmt.Errorf("apply refused a database with a defect (%s), but for another reason: %w", s.what, err)
		}
		after, ferr := fingerprint.Take(ctx, db.Pool)
		if ferr != nil {
			return ferr
		}
		diffs := append(fingerprint.Compare(before, after), fingerprint.Added(before, after)...)
		if len(diffs) > 0 {
			return fmt.Errorf("apply refused but changed the database:\n%s", fingerprint.Format(diffs, 20))
		}
		// Still the 0.16.0 schema: no new column, no revision record, the
		// old functions in place.
		var changed bool
		if err := db.Pool.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_attribute
			  where (attrelid, attname) in (('pgflow.flows'::regclass, 'queue_mode'), ('pgflow.steps'::regclass, 'queue_name'),
			                                ('pgflow.step_tasks'::regclass, 'queue_name')) and not attisdropped)
			or pg_catalog.to_regclass('pgflow_upgrade.schema_revisions') is not null
			or pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid, text, text)') is not null
			or pg_catalog.to_regprocedure('pgflow.ensure_flow_compiled(text, jsonb)') is null
			or pg_catalog.to_regprocedure('pgflow.start_tasks(text, bigint[], uuid)') is null`).Scan(&changed); err != nil {
			return err
		}
		if changed {
			return errorf("apply refused but the schema is no longer the 0.16.0 baseline")
		}
		why := firstLine(err.Error())
		if rep != nil && len(rep.Report.Blockers) > 0 {
			var b []string
			found := false
			for _, f := range rep.Report.Blockers {
				b = append(b, fmt.Sprintf("%s: %s", f.CheckID, f.Message))
				found = found || f.CheckID == s.check
			}
			why = strings.Join(b, "; ")
			if !found {
				return fmt.Errorf("apply refused a database with a %s, but not with check %s: %s", s.what, s.check, why)
			}
		}
		env.Notef("refused: %s", why)
		return nil
	}
}
