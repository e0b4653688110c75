package upgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// RevisionsTable is the tool's own record of what it applied. It lives in
// schema pgflow_upgrade, never in pgflow (whose catalog must be exactly
// upstream's).
const RevisionsTable = "pgflow_upgrade.schema_revisions"

// SupabaseRepairCommand is what a Supabase user runs when apply was not
// given the migrations folder: it marks upstream's 0.17.0 migration applied
// in the ledger so `supabase migration up` / `db push` skips it.
const SupabaseRepairCommand = "supabase migration repair --status applied " + UpstreamVersion

// ErrSupabaseDir: --supabase-dir does not hold exactly one copy of
// upstream's 0.17.0 migration.
var ErrSupabaseDir = errors.New("the Supabase migrations folder does not hold upstream's 0.17.0 migration")

// supabaseFile is the user's copy of upstream's migration.
type supabaseFile struct {
	Path    string
	Version string
	Name    string
}

var supabaseName = regexp.MustCompile(`^([0-9]{14})_(` + UpstreamName + `)\.sql$`)

// findSupabaseMigration looks for *_pgflow_private_step_queues.sql in dir
// (the file `npx pgflow install` copies there).
func findSupabaseMigration(dir string) (*supabaseFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrSupabaseDir, dir, err)
	}
	var found []*supabaseFile
	for _, e := range entries {
		if m := supabaseName.FindStringSubmatch(e.Name()); m != nil && e.Type().IsRegular() {
			found = append(found, &supabaseFile{Path: filepath.Join(dir, e.Name()), Version: m[1], Name: m[2]})
		}
	}
	switch len(found) {
	case 0:
		return nil, fmt.Errorf("%w: no *_%s.sql in %s (copy pgflow 0.17.0's migrations there first: `npx pgflow@0.17.0 install`, or leave out --supabase-dir and run `%s` afterwards)",
			ErrSupabaseDir, UpstreamName, dir, SupabaseRepairCommand)
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%w: more than one *_%s.sql in %s (%s, %s, ...): keep the one pgflow installed", ErrSupabaseDir, UpstreamName, dir,
		filepath.Base(found[0].Path), filepath.Base(found[1].Path))
}

// recordSupabase marks the user's copy of upstream's migration applied in
// supabase_migrations.schema_migrations (version and name; only the columns
// the table has). Without a file (no --supabase-dir) it only says what to run.
func recordSupabase(ctx context.Context, tx pgx.Tx, f *supabaseFile) (bool, string, error) {
	if f == nil {
		return false, "not recorded in the Supabase ledger (no --supabase-dir): run `" + SupabaseRepairCommand + "` so that `supabase migration up` skips pgflow's own 0.17.0 migration", nil
	}
	var hasVersion, hasName bool
	err := tx.QueryRow(ctx, `
		select coalesce(bool_or(a.attname = 'version'), false), coalesce(bool_or(a.attname = 'name'), false)
		  from pg_catalog.pg_attribute a
		 where a.attrelid = pg_catalog.to_regclass('supabase_migrations.schema_migrations')
		   and a.attnum > 0 and not a.attisdropped`).Scan(&hasVersion, &hasName)
	if err != nil {
		return false, "", fmt.Errorf("inspecting supabase_migrations.schema_migrations: %w", err)
	}
	if !hasVersion {
		return false, "supabase_migrations.schema_migrations not present (or without a version column): nothing recorded; found " + filepath.Base(f.Path), nil
	}
	q := `insert into supabase_migrations.schema_migrations (version) values ($1) on conflict do nothing`
	args := []any{f.Version}
	if hasName {
		q = `insert into supabase_migrations.schema_migrations (version, name) values ($1, $2) on conflict do nothing`
		args = append(args, f.Name)
	}
	tag, err := tx.Exec(ctx, q, args...)
	if err != nil {
		return false, "", fmt.Errorf("recording %s in supabase_migrations.schema_migrations: %w", f.Version, err)
	}
	if tag.RowsAffected() == 0 {
		return true, "supabase_migrations.schema_migrations already had " + f.Version, nil
	}
	return true, "recorded " + f.Version + "_" + f.Name + " as applied in supabase_migrations.schema_migrations", nil
}

// recordRevision notes in the tool's own schema that m was applied.
func recordRevision(ctx context.Context, tx pgx.Tx, m migrations.Migration) error {
	_, err := tx.Exec(ctx, `
		create schema if not exists pgflow_upgrade;
		create table if not exists pgflow_upgrade.schema_revisions (
		  version    text primary key,
		  name       text not null,
		  applied_at timestamptz not null default pg_catalog.now()
		)`)
	if err != nil {
		return fmt.Errorf("creating %s: %w", RevisionsTable, err)
	}
	if _, err := tx.Exec(ctx, `insert into pgflow_upgrade.schema_revisions (version, name) values ($1, $2)
		on conflict (version) do nothing`, m.Version, m.Name); err != nil {
		return fmt.Errorf("recording %s in %s: %w", m.Version, RevisionsTable, err)
	}
	return nil
}

// appliedVersions reads pgflow_upgrade.schema_revisions (empty when absent).
func appliedVersions(ctx context.Context, q Querier) (map[string]bool, error) {
	out := map[string]bool{}
	var exists bool
	if err := q.QueryRow(ctx, `select pg_catalog.to_regclass('pgflow_upgrade.schema_revisions') is not null`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("looking for %s: %w", RevisionsTable, err)
	}
	if !exists {
		return out, nil
	}
	rows, err := q.Query(ctx, `select version from pgflow_upgrade.schema_revisions`)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", RevisionsTable, err)
	}
	for _, v := range vs {
		out[v] = true
	}
	return out, nil
}
