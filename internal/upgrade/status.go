package upgrade

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
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
	Applied bool   `json:"applied"`
}

// SumStatus says whether the embedded migrations match atlas.sum.
type SumStatus struct {
	Valid bool   `json:"valid"`
	Hash  string `json:"hash"`
	Error string `json:"error,omitempty"`
}

// StatusReport is what `status` prints.
type StatusReport struct {
	State audit.SchemaInfo `json:"state"`
	// PgflowVersion: which pgflow was found and the next step.
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	Applied       []Revision          `json:"applied"`
	Pending       []string            `json:"pending"`
	Migrations    []MigrationStatus   `json:"migrations"`
	AtlasSum      SumStatus           `json:"atlas_sum"`
}

// NeedsAttention: a state apply cannot act on, or tampered migrations.
func (s *StatusReport) NeedsAttention() bool {
	return !s.AtlasSum.Valid || s.State.State == audit.StatePartial || s.State.State == audit.StateUnknown || s.State.State == audit.StateOlder
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
	tx, err := audit.BeginReadOnly(ctx, conn, readStatementTimeout, readLockTimeout, "pgflow-upgrade status")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	if rep.State, err = DetectState(ctx, tx); err != nil {
		return nil, err
	}
	rep.PgflowVersion = rep.State.Version
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
	applied := map[string]bool{}
	for _, r := range rep.Applied {
		applied[r.Version] = true
	}
	// A 0.17.0 database needs nothing, whoever upgraded it.
	done := rep.State.State == audit.StateUpgraded
	for _, m := range all {
		rep.Migrations = append(rep.Migrations, MigrationStatus{Version: m.Version, Name: m.Name, File: m.File, Applied: applied[m.Version] || done})
		if !applied[m.Version] && !done {
			rep.Pending = append(rep.Pending, m.Version+"_"+m.Name)
		}
	}
	return rep, nil
}
