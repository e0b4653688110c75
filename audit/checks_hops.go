package audit

import (
	"context"
	"fmt"
	"strings"
)

// A hop's own checks: what makes one of upstream's files fail (or what it
// changes for users), declared with the hop that brings them (Check.Hop,
// the file's index). The audit runs them within plan.hops, for the hops of
// its plan only; apply runs the ones declared UnderLocks in its transaction
// right before that hop, and refuses on a blocker.

// validStatuses are the statuses 0.15.1's valid_status CHECK (upstream's
// file 22) admits.
var validStatuses = []string{"queued", "started", "completed", "failed", "skipped", "cancelled"}

// hopsValidStatus is hops.valid_status.
var hopsValidStatus = Check{
	ID: "hops.valid_status", Title: "step_tasks rows with a status 0.15.1's valid_status CHECK rejects (allowed: " + strings.Join(validStatuses, ", ") + ")",
	Severity: Blocker, Runs: InAudit | BeforeLocks | UnderLocks, Hop: 22, Needs: NeedsPgflow,
	Meaning: "Upstream's file 22 (0.15.1) replaces step_tasks' valid_status CHECK by one that admits " + strings.Join(validStatuses, ", ") +
		" only: one row with another status makes that statement, and with it the whole transaction, fail. The count is info while it is 0. " +
		"apply counts them before it builds that CHECK beforehand (its validation would fail) and again under its locks right before the hop.",
	Remedy: "Give each such task a status the CHECK admits (or delete it), then audit again.",
	Run:    checkValidStatus,
}

// validStatusDef is how PostgreSQL prints 0.15.1's CHECK
// (pg_get_constraintdef).
func validStatusDef() string {
	quoted := make([]string, len(validStatuses))
	for i, s := range validStatuses {
		quoted[i] = "'" + s + "'::text"
	}
	return "CHECK ((status = ANY (ARRAY[" + strings.Join(quoted, ", ") + "])))"
}

func checkValidStatus(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	// A validated CHECK with exactly this definition (the one apply builds
	// beforehand, or the file's own) already holds for every row and is
	// enforced on every write: no scan of the table needed.
	var held bool
	if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_constraint
		where conrelid = 'pgflow.step_tasks'::pg_catalog.regclass and contype = 'c' and convalidated
		  and pg_catalog.pg_get_constraintdef(oid) = $1)`, validStatusDef()).Scan(&held); err != nil {
		return nil, fmt.Errorf("looking for a validated CHECK like 0.15.1's valid_status: %w", err)
	}
	var bad int64
	if !held {
		err := scanTable(ctx, q, "step_tasks", func(int64) (int64, error) {
			return 0, q.QueryRow(ctx, `select pg_catalog.count(*) from pgflow.step_tasks where status <> all ($1::text[])`, validStatuses).Scan(&bad)
		})
		if err != nil {
			return nil, fmt.Errorf("counting step_tasks 0.15.1's valid_status rejects: %w", err)
		}
	}
	f := c.finding(bad, fmt.Sprintf("hop to 0.15.1: %d step_tasks rows have a status its valid_status CHECK rejects (apply refuses while any does)", bad), nil)
	if bad == 0 {
		f.Severity = Info
	}
	return []Finding{f}, nil
}

// hopsOwnedQueueMissing is hops.owned_queue_missing.
var hopsOwnedQueueMissing = Check{
	ID: "hops.owned_queue_missing", Title: "step-mode routes whose pgmq queue is missing, which 0.17.1 rejects", Severity: Warning,
	Runs: InAudit, Hop: 25, Needs: NeedsPgflow | NeedsPGMQ,
	Meaning: "From 0.17.1 (upstream's file 25) pgflow._assert_step_queue_available raises when a route a step-mode flow owns has no listed pgmq queue; " +
		"ensure_flow_compiled runs it at every startup of that flow's workers, so they fail to start (\"queue ... owned by flow ... is not listed in PGMQ\") " +
		"until the queue exists again, where 0.17.0 verified the flow. The hop itself applies.",
	Remedy: "Create each missing queue (select pgmq.create('<queue>')); if the loss is intended, create it all the same, delete the flow " +
		"(select pgflow.delete_flow_and_data('<slug>')) and let its workers compile it again.",
	Run: checkOwnedQueueMissing,
}

func checkOwnedQueueMissing(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	v17, err := hasQueueMode(ctx, q)
	if err != nil || !v17 {
		return nil, err // before 0.17.0 no flow is in step mode
	}
	n, samples, err := missingQueues(ctx, q, `select s.flow_slug, s.queue_name as queue from pgflow.steps s
		join pgflow.flows f on f.flow_slug = s.flow_slug where f.queue_mode = 'step'`, env.Sample)
	if err != nil || n == 0 {
		return nil, err
	}
	return []Finding{c.finding(n, fmt.Sprintf("%d step-mode route(s) without their pgmq queue: after the hop to 0.17.1 the workers of their flows "+
		"fail at startup (ensure_flow_compiled raises) until the queue exists again", n), samples)}, nil
}

// hopsPgCron is hops.pg_cron.
var hopsPgCron = Check{
	ID: "hops.pg_cron", Title: "pg_cron's cron.schedule(text, text, text), which the telemetry file calls (install pg_cron >= 1.5)",
	Severity: Blocker, Runs: InAudit | UnderLocks, Hop: 26,
	Meaning: "Upstream's file 26 (0.17.1's telemetry) schedules the daily pg_cron job pgflow_telemetry_report with cron.schedule(job_name, schedule, command): " +
		"without that function the file fails. The finding also says what the job sends and how to opt out. It is info in the audit (a plan that stops at " +
		"0.17.0 does not take the hop) and a blocker under apply's locks right before the hop.",
	Remedy: "Install pg_cron (>= 1.5) in this database, or stop at 0.17.0 (apply --to 0.17.0); apply --telemetry off opts out of the job.",
	Run:    checkPgCron,
}

func checkPgCron(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error) {
	var cron bool
	if err := q.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
		where n.nspname = 'cron' and p.proname = 'schedule' and p.pronargs = 3)`).Scan(&cron); err != nil {
		return nil, fmt.Errorf("looking for pg_cron: %w", err)
	}
	state := "pg_cron's cron.schedule is there"
	if !cron {
		state = "pg_cron's cron.schedule is MISSING: apply refuses the hop to 0.17.1 until pg_cron (>= 1.5) is installed"
	}
	f := c.finding(1, "telemetry: 0.17.1 schedules pg_cron job pgflow_telemetry_report (daily; it posts pgflow_telemetry.preview()'s "+
		"anonymous usage counts through pg_net); apply --telemetry off opts out in the same transaction; "+state, nil)
	if cron || env.Mode == ModeAudit {
		f.Severity = Info
	}
	return []Finding{f}, nil
}
