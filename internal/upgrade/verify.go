package upgrade

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// VerifyReport is what `verify` prints.
type VerifyReport struct {
	OK     bool           `json:"ok"`
	Checks []CheckOutcome `json:"checks"`
}

// Verify runs Checks in one READ ONLY transaction with statement and lock
// timeouts: after an upgrade, the new schema is whole and the 0.16.0 worker
// protocol is fenced. OK is false when any check failed.
func Verify(ctx context.Context, conn *pgx.Conn) (*VerifyReport, error) {
	tx, err := session.BeginReadOnly(ctx, conn, readStatementTimeout, readLockTimeout, "pgflow-upgrade verify")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	out, err := RunPostConditions(ctx, tx, true)
	if err != nil {
		return nil, fmt.Errorf("verifying the upgraded schema: %w", err)
	}
	q, err := quiesceClosed(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("verifying the upgraded schema: %w", err)
	}
	out = append(out, q)
	tc, err := telemetryChecks(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("verifying pgflow 0.17.1's telemetry schema: %w", err)
	}
	out = append(out, tc...)
	pc, err := pgmqClaimPath(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("verifying pgmq's claim path: %w", err)
	}
	out = append(out, pc)
	return &VerifyReport{OK: len(Failed(out)) == 0, Checks: out}, nil
}

// telemetryChecks: at 0.17.1's catalog or later (upstream's file 26 on),
// schema pgflow_telemetry is what upstream's files build, and the release
// is told as detection tells it: 0.17.1, or 0.17.1 with the endpoint fix
// (upstream's newest), by pgflow_telemetry.report()'s digest; a report()
// that is neither fails. Nothing to check before 0.17.1.
func telemetryChecks(ctx context.Context, q Querier) ([]CheckOutcome, error) {
	d, err := versions.Detect(ctx, q)
	if err != nil {
		return nil, err
	}
	rel := d.Release
	if rel == nil || rel.Files < 26 {
		return nil, nil
	}
	want, err := versions.TelemetryCatalog()
	if err != nil {
		return nil, err
	}
	got, err := catalog.Read(ctx, q, versions.TelemetrySchema)
	if err != nil {
		return nil, err
	}
	cat := CheckOutcome{ID: "catalog_pgflow_telemetry",
		Title: "schema pgflow_telemetry is what upstream's files build (0.17.1: tables, constraints, functions and their attributes)"}
	cat.OK, cat.Detail = compareCatalog(want, got, "equal to upstream's")
	release := CheckOutcome{ID: "release_0_17_1",
		Title: "pgflow_telemetry.report() is 0.17.1's or the endpoint fix's (told apart as status tells them)",
		OK:    !rel.ReportUnknown, Detail: rel.Name}
	switch {
	case rel.ReportUnknown:
		release.Detail = strings.Join(rel.Evidence, "; ") + ": not upstream's function; rerun apply with your copy of upstream's files (--pgflow-migrations DIR)"
	case !rel.AtNewest():
		release.Detail += "; upstream's newest is " + rel.Newest + ": apply with your copy of upstream's files reaches it"
	}
	return []CheckOutcome{cat, release}, nil
}

// pgmqClaimPath: pgmq is not stopped at 1.10.0 or 1.10.1 with queues
// created before 1.10.0, whose read, pop and set_vt fail (42804): no worker
// could claim from them, whatever the schema says. Not one of apply's
// post-conditions: apply --pgmq's own hop runs after them and checks the
// claim path itself. Catalog and pgmq.meta reads only.
func pgmqClaimPath(ctx context.Context, q Querier) (CheckOutcome, error) {
	o := CheckOutcome{ID: "pgmq_claim_path", Title: "pgmq's read, pop and set_vt work on every queue (not pgmq 1.10.0/1.10.1 over older queues)", OK: true}
	info, err := pgmqver.Detect(ctx, q)
	if err != nil {
		return o, err
	}
	v, perr := pgmqver.Parse(info.Version)
	if info.Kind != "extension" || perr != nil || !pgmqver.BreaksClaim(v) {
		o.Detail = "pgmq " + info.String()
		return o, nil
	}
	var n int64
	var names []string
	if err := q.QueryRow(ctx, pgmqver.StaleClaimTablesSQL, 5).Scan(&n, &names); err != nil {
		return o, err
	}
	if n > 0 {
		o.OK = false
		o.Detail = fmt.Sprintf("pgmq %s: read, pop and set_vt fail (42804) on %d queue(s) created before 1.10.0 (e.g. %s); run `pgflow-upgrade apply --pgmq 1.13.1` (or 1.11.0 or later)",
			info.Version, n, strings.Join(names, ", "))
	}
	return o, nil
}

// quiesceClosed: no apply --quiesce record is left open. Not one of the
// schema's post-conditions (apply checks those inside its own quiesce): an
// apply --quiesce killed after its commit, before its restore, leaves an
// upgraded schema with every worker function disabled and pgflow's cron
// jobs paused.
func quiesceClosed(ctx context.Context, q Querier) (CheckOutcome, error) {
	o := CheckOutcome{ID: "quiesce_closed", Title: "no apply --quiesce left its record open (worker functions disabled, cron jobs paused)", OK: true}
	rec, unreadable, err := quiesce.Find(ctx, q)
	switch {
	case err != nil:
		return o, err
	case unreadable:
		o.Detail = "not checked: this role cannot read pgflow_upgrade.quiesce"
	case rec != nil:
		o.OK = false
		q := versions.NewQuiesce(rec)
		o.Detail = ErrQuiesceRecorded.Error() + " " + quiesceHeld(q) + "; " + quiesceCommands(q)
	}
	return o, nil
}
