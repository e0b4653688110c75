// Package upstreamdb builds pgflow databases the way upstream's own
// migration files build them: from a copy of those files (the user's, or
// the tests' vendored one, recognised by internal/pgflowfiles), each file
// in its own transaction with its row in the Supabase ledger, as
// `supabase db push` runs them. `fixtures replay --pgflow-migrations` and
// the tests' upstream databases (internal/testdb) both build through it, on
// throwaway databases only.
//
// Upstream's files expect a Supabase database: pgmq, pg_net, pg_cron >= 1.5
// (a schedule of "15 seconds"), realtime and vault. On a plain PostgreSQL
// the fixtures package's stand-ins stand for what the server lacks, and
// pg_cron's and pg_net's stand-ins (pgmq's too, when it is one) are each
// registered as an extension row in pg_catalog.pg_extension, so that
// upstream's CREATE EXTENSION IF NOT EXISTS statements find them. The rows
// own no objects: the stand-ins' objects stay plain ones.
package upstreamdb

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
)

// The versions the extension rows of the stand-ins claim: the releases
// Supabase ships, which upstream's files are written for.
const (
	StandInCronVersion = "1.6"
	StandInNetVersion  = "0.14.0"
	StandInPGMQVersion = "1.5.1"
)

// Components says what a database was prepared with: each a fixtures kind
// (fixtures.PGMQExtension or fixtures.PGMQStandIn; fixtures.CronExtension
// or fixtures.CronStandIn). pg_net is always the stand-in.
type Components struct {
	PGMQ string
	Cron string
}

// Describe says which pgmq, pg_cron and pg_net the database has, for a log.
func (c Components) Describe() string {
	pgmq := "the real pgmq extension"
	if c.PGMQ == fixtures.PGMQStandIn {
		pgmq = "the pgmq stand-in (registered as extension pgmq " + StandInPGMQVersion + ")"
	}
	cron := "the real pg_cron extension"
	if c.Cron == fixtures.CronStandIn {
		cron = "the pg_cron stand-in (registered as extension pg_cron " + StandInCronVersion + ")"
	}
	return fmt.Sprintf("%s; %s; the pg_net stand-in (registered as extension pg_net %s)", pgmq, cron, StandInNetVersion)
}

// Options choose the stand-ins.
type Options struct {
	// PGMQStandIn installs the pgmq stand-in even where the server offers
	// the real extension (the test suite's run on the stand-in).
	PGMQStandIn bool
}

// Prepare installs on conn's database, which must hold no pgflow yet, what
// upstream's files need: pgmq (the real extension where the server offers
// it, else the stand-in), the Supabase stand-ins (realtime, net, vault, the
// empty ledger) and pg_cron (its stand-in unless the database has the real
// one), the stand-ins registered as extensions.
func Prepare(ctx context.Context, conn *pgx.Conn, opts Options) (Components, error) {
	var c Components
	install := fixtures.InstallPGMQ
	if opts.PGMQStandIn {
		install = fixtures.InstallPGMQStandIn
	}
	var err error
	if c.PGMQ, err = install(ctx, conn); err != nil {
		return c, err
	}
	if err := fixtures.InstallSupabaseStubs(ctx, conn); err != nil {
		return c, err
	}
	// The stubs fill the ledger for the 0.16.0 fixture; here it holds what
	// push writes for the files run, nothing else.
	if _, err := conn.Exec(ctx, `delete from supabase_migrations.schema_migrations`); err != nil {
		return c, fmt.Errorf("emptying the Supabase ledger: %w", err)
	}
	if c.Cron, err = fixtures.CronKind(ctx, conn); err != nil {
		return c, err
	}
	return c, RegisterStandIns(ctx, conn, c)
}

// RegisterStandIns records the stand-ins of a database that has the
// Supabase stand-ins (fixtures.InstallSupabaseStubs) as extensions: pg_net
// always, pg_cron and pgmq when c says they are stand-ins. A restored
// capture that upstream's files will run on (a rehearsal) needs them as
// much as a database those files build.
func RegisterStandIns(ctx context.Context, db fixtures.DB, c Components) error {
	rows := [][3]string{{"pg_net", "net", StandInNetVersion}}
	if c.Cron == fixtures.CronStandIn {
		rows = append(rows, [3]string{"pg_cron", "cron", StandInCronVersion})
	}
	if c.PGMQ == fixtures.PGMQStandIn {
		rows = append(rows, [3]string{"pgmq", "pgmq", StandInPGMQVersion})
	}
	for _, r := range rows {
		if err := registerStandIn(ctx, db, r[0], r[1], r[2]); err != nil {
			return err
		}
	}
	return nil
}

// Build prepares conn's database (Prepare) and runs upstream's first n
// files of copy on it (Push).
func Build(ctx context.Context, conn *pgx.Conn, copy *pgflowfiles.Copy, n int, opts Options) (Components, error) {
	c, err := Prepare(ctx, conn, opts)
	if err != nil {
		return c, err
	}
	_, err = Push(ctx, conn, copy, 0, n)
	return c, err
}

// Push runs upstream's files from+1..to of copy on conn, each in its own
// transaction with its ledger row, as `supabase db push` does, each file's
// content checked against its atlas.sum hash as it is read. It returns how
// long each file's transaction took, begin to commit (its locks are held
// that long).
func Push(ctx context.Context, conn *pgx.Conn, copy *pgflowfiles.Copy, from, to int) ([]time.Duration, error) {
	if from < 0 || to > len(copy.Files) || from > to {
		return nil, fmt.Errorf("pushing upstream's files %d..%d: the copy holds files 1..%d", from+1, to, len(copy.Files))
	}
	var took []time.Duration
	for n := from + 1; n <= to; n++ {
		start := time.Now()
		if err := pushFile(ctx, conn, copy, n); err != nil {
			return took, err
		}
		took = append(took, time.Since(start))
	}
	return took, nil
}

// pushFile runs upstream's file n in its own transaction with its ledger
// row.
func pushFile(ctx context.Context, conn *pgx.Conn, copy *pgflowfiles.Copy, n int) error {
	f := copy.File(n)
	sql, err := copy.Read(n)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("applying upstream's %s (%s): %w", f.Name, f.Path, err)
	}
	if _, err := pgflowfiles.RecordApplied(ctx, tx, f.Version(), f.Title(), sql); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing upstream's %s: %w", f.Name, err)
	}
	return nil
}

// registerStandIn records a stand-in as extension ext in schema, so that
// CREATE EXTENSION IF NOT EXISTS ext finds it. pg_nextoid gives the row an
// unused oid (superuser only, as writing pg_extension is).
func registerStandIn(ctx context.Context, conn fixtures.DB, ext, schema, version string) error {
	tag, err := conn.Exec(ctx, `
		insert into pg_catalog.pg_extension (oid, extname, extowner, extnamespace, extrelocatable, extversion)
		select pg_catalog.pg_nextoid('pg_catalog.pg_extension', 'oid', 'pg_catalog.pg_extension_oid_index'),
		       $1::text::pg_catalog.name, r.oid, n.oid, false, $3::text
		  from pg_catalog.pg_namespace n, pg_catalog.pg_roles r
		 where n.nspname = $2::text and r.rolname = current_user
		   and not exists (select 1 from pg_catalog.pg_extension e where e.extname = $1::text::pg_catalog.name)`,
		ext, schema, version)
	if err != nil {
		return fmt.Errorf("registering the %s stand-in as an extension (needs a superuser, as writing pg_catalog.pg_extension does): %w", ext, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("registering the %s stand-in as an extension: schema %s missing or %s already installed", ext, schema, ext)
	}
	return nil
}
