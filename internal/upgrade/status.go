package upgrade

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// Read-only bounds of status and verify: catalog queries, so short.
const (
	readStatementTimeout = 10 * time.Second
	readLockTimeout      = time.Second
)

// Revision is one row of pgflow_upgrade.schema_revisions.
type Revision struct {
	Version   string    `json:"version"`
	Name      string    `json:"name"`
	AppliedAt time.Time `json:"applied_at"`
}

// MigrationStatus is one embedded migration and whether it is applied.
type MigrationStatus struct {
	Version string `json:"version"`
	Name    string `json:"name"`
	File    string `json:"file"`
	// Applied: this revision is recorded in pgflow_upgrade.schema_revisions.
	Applied bool `json:"applied"`
	// Status says the same in words, and why a revision that is not
	// recorded is not pending: "applied <time>", "pending", or "not needed
	// (pgflow 0.17.0 found, applied by pgflow's own migration)".
	Status string `json:"status"`
}

// SumStatus says whether the embedded migrations match atlas.sum.
type SumStatus struct {
	Valid bool   `json:"valid"`
	Hash  string `json:"hash"`
	Error string `json:"error,omitempty"`
}

// StatusReport is what `status` prints.
type StatusReport struct {
	State versions.SchemaInfo `json:"state"`
	// PgflowVersion: which pgflow was found and the next step.
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	Applied       []Revision          `json:"applied"`
	Pending       []string            `json:"pending"`
	Migrations    []MigrationStatus   `json:"migrations"`
	AtlasSum      SumStatus           `json:"atlas_sum"`
	// Newer: recorded revisions no embedded migration has: a newer
	// pgflow-upgrade applied them, and this one refuses to apply.
	Newer []string `json:"newer_revisions,omitempty"`
	// PGMQ: the pgmq found, its layout and the newest version the server
	// offers (the audit's pgmq.update_path says whether the update to it
	// would go through; apply --pgmq runs it).
	PGMQ pgmqver.Found `json:"pgmq"`
}

// NeedsAttention: a state apply cannot act on, or tampered migrations (an
// older release is one it acts on when its plan may start).
func (s *StatusReport) NeedsAttention() bool {
	return !s.AtlasSum.Valid || len(s.Newer) > 0 || s.State.State == versions.SchemaPartial || s.State.State == versions.SchemaUnknown ||
		(s.State.State == versions.SchemaOlder && !s.State.Version.PlanStarts())
}

// Status reads the schema state and revisions in one READ ONLY transaction
// with statement and lock timeouts (catalog queries and one small table).
func Status(ctx context.Context, conn *pgx.Conn) (*StatusReport, error) {
	rep := &StatusReport{Applied: []Revision{}, Pending: []string{}, AtlasSum: SumStatus{Valid: true, Hash: migrations.Hash()}}
	if err := migrations.Verify(); err != nil {
		rep.AtlasSum.Valid, rep.AtlasSum.Error = false, err.Error()
	}
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	tx, err := session.BeginReadOnly(ctx, conn, readStatementTimeout, readLockTimeout, "pgflow-upgrade status")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	if rep.State, err = versions.DetectSchema(ctx, tx); err != nil {
		return nil, err
	}
	rep.PgflowVersion = rep.State.Version
	if rep.PGMQ, err = pgmqver.Detect(ctx, tx); err != nil {
		return nil, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.schema_revisions') is not null`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking for %s: %w", RevisionsTable, err)
	}
	if exists {
		rows, err := tx.Query(ctx, `select version, name, applied_at from pgflow_upgrade.schema_revisions order by version`)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
		}
		if rep.Applied, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Revision]); err != nil {
			return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
		}
	}
	applied := map[string]Revision{}
	for _, r := range rep.Applied {
		applied[r.Version] = r
	}
	if rep.Newer = newerThan(all, rep.Applied); len(rep.Newer) > 0 && rep.PgflowVersion != nil {
		d := *rep.PgflowVersion
		d.NextStep = NewerNextStep(rep.Newer)
		rep.PgflowVersion = &d
	}
	// A 0.17.x database needs nothing, whoever upgraded it.
	done := rep.State.State == versions.SchemaUpgraded
	for _, m := range all {
		ms := MigrationStatus{Version: m.Version, Name: m.Name, File: m.File, Status: "pending"}
		r, ok := applied[m.Version]
		switch {
		case ok:
			ms.Applied, ms.Status = true, "applied "+r.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
		case done:
			ms.Status = "not needed (" + foundVersion(rep.PgflowVersion) + " found, applied by pgflow's own migration)"
		default:
			rep.Pending = append(rep.Pending, m.Version+"_"+m.Name)
		}
		rep.Migrations = append(rep.Migrations, ms)
	}
	return rep, nil
}

// foundVersion names the pgflow version detected, for status lines.
func foundVersion(d *versions.Detection) string {
	if d == nil || d.Found == "" {
		return "pgflow 0.17.x"
	}
	return "pgflow " + d.Found
}

// newerThan lists the versions of applied that no migration of all has.
func newerThan(all []migrations.Migration, applied []Revision) []string {
	known := map[string]bool{}
	for _, m := range all {
		known[m.Version] = true
	}
	var out []string
	for _, r := range applied {
		if !known[r.Version] {
			out = append(out, r.Version)
		}
	}
	return out
}

// NewerNextStep is the next step on a database a newer pgflow-upgrade
// upgraded further: this one refuses to apply there.
func NewerNextStep(newer []string) string {
	return fmt.Sprintf("a newer pgflow-upgrade recorded revision %s in %s, which this one does not know (and refuses to apply over): use that newer pgflow-upgrade",
		strings.Join(newer, ", "), RevisionsTable)
}

// NewerRevisions reads the revisions recorded in
// pgflow_upgrade.schema_revisions that no embedded migration has (none when
// the table does not exist), in q (a read-only transaction will do).
func NewerRevisions(ctx context.Context, q session.Querier) ([]string, error) {
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.schema_revisions') is not null`).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	rows, err := q.Query(ctx, `select version, name, applied_at from pgflow_upgrade.schema_revisions order by version`)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Revision])
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
	}
	return newerThan(all, applied), nil
}
