package pgflowfiles

import (
	"context"
	"fmt"
	"strings"

	"ariga.io/atlas/sql/migrate"
	"github.com/jackc/pgx/v5"
)

// LedgerTable is the Supabase CLI's migration ledger.
const LedgerTable = "supabase_migrations.schema_migrations"

// Statements splits a migration file into its statements, the way a
// migration runner reads it (dollar quotes and BEGIN ATOMIC bodies kept
// whole): the ledger's statements column holds them.
func Statements(sql string) ([]string, error) {
	stmts, err := migrate.Stmts(sql)
	if err != nil {
		return nil, fmt.Errorf("splitting the migration into statements: %w", err)
	}
	out := make([]string, len(stmts))
	for i, s := range stmts {
		out[i] = strings.TrimSpace(s.Text)
	}
	return out, nil
}

// LedgerColumns says which of the ledger's columns a database has: the
// table's shape varies with the Supabase CLI that created it, and a
// database may have no ledger at all (then Version is false).
type LedgerColumns struct {
	Version, Name, Statements bool
}

// ReadLedgerColumns inspects supabase_migrations.schema_migrations.
func ReadLedgerColumns(ctx context.Context, tx pgx.Tx) (LedgerColumns, error) {
	var c LedgerColumns
	err := tx.QueryRow(ctx, `
		select coalesce(bool_or(a.attname = 'version'), false),
		       coalesce(bool_or(a.attname = 'name'), false),
		       coalesce(bool_or(a.attname = 'statements'), false)
		  from pg_catalog.pg_attribute a
		 where a.attrelid = pg_catalog.to_regclass('supabase_migrations.schema_migrations')
		   and a.attnum > 0 and not a.attisdropped`).Scan(&c.Version, &c.Name, &c.Statements)
	if err != nil {
		return c, fmt.Errorf("inspecting %s: %w", LedgerTable, err)
	}
	return c, nil
}

// RecordApplied writes the ledger row `supabase db push` writes for a
// migration it applied: version (the file's 14-digit prefix), name and the
// file's statements, in the caller's transaction (push records each file
// in the transaction that applies it). A version already recorded is left
// as it is (recorded false). Without a ledger table nothing is written.
func RecordApplied(ctx context.Context, tx pgx.Tx, version, name, sql string) (recorded bool, err error) {
	cols, err := ReadLedgerColumns(ctx, tx)
	if err != nil || !cols.Version {
		return false, err
	}
	names := []string{"version"}
	args := []any{version}
	if cols.Name {
		names, args = append(names, "name"), append(args, name)
	}
	if cols.Statements {
		stmts, err := Statements(sql)
		if err != nil {
			return false, fmt.Errorf("recording %s_%s in %s: %w", version, name, LedgerTable, err)
		}
		names, args = append(names, "statements"), append(args, stmts)
	}
	params := make([]string, len(args))
	for i := range args {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	// The column names are this function's own constants.
	q := "insert into supabase_migrations.schema_migrations (" + strings.Join(names, ", ") + ") values (" +
		strings.Join(params, ", ") + ") on conflict do nothing"
	tag, err := tx.Exec(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("recording %s_%s in %s: %w", version, name, LedgerTable, err)
	}
	return tag.RowsAffected() == 1, nil
}
