package capture

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upstreamdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// restoreExact rebuilds a version 2 capture in an empty database, in one
// transaction: pgmq (the extension when the server has it, else the
// stand-in) and the Supabase stand-ins the engine calls, the roles the
// grants name, then the file in its order: the pre DDL, the rows into
// tables that have no constraint, index or trigger yet, the queues and
// their messages, the sequence positions, the post DDL. No model of pgflow
// is involved: what is rebuilt is what the source's catalog said.
//
// The DDL of the file is executed as it is: a capture is code, like a
// pg_dump file; replay only captures from a source you trust.
func restoreExact(ctx context.Context, conn *pgx.Conn, h Header, next func() (Record, bool, error)) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := restorePrerequisites(ctx, tx, h); err != nil {
		return err
	}
	// Function bodies are checked when called, not when created: a SQL
	// function may name a table or view made after it.
	if _, err := tx.Exec(ctx, `set local check_function_bodies = off; set local search_path to ''`); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	b := &batch{tx: tx, columns: map[string]string{}}
	var pending *Record // read by a COPY that it ended
	for {
		var r Record
		var ok bool
		if pending != nil {
			r, ok, pending = *pending, true, nil
		} else if r, ok, err = next(); err != nil {
			return err
		}
		if !ok {
			break
		}
		switch {
		case r.Copy != nil:
			if err := b.flush(ctx); err != nil {
				return err
			}
			after, more, err := copyIn(ctx, tx, h, r, next)
			if err != nil {
				return err
			}
			if more { // else the file ended: next() says so again
				pending = &after
			}
		case r.DDL != "":
			if err := b.flush(ctx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, r.DDL); err != nil {
				return fmt.Errorf("restore: the captured %s DDL %q: %w", r.Section, firstLine(r.DDL), err)
			}
		case r.Seq != nil:
			if err := b.flush(ctx); err != nil {
				return err
			}
			if err := restoreSeq(ctx, tx, *r.Seq); err != nil {
				return err
			}
		case r.Table == "pgmq.queue":
			if err := b.flush(ctx); err != nil {
				return err
			}
			if _, err := restoreQueue(ctx, tx, r.Row); err != nil {
				return err
			}
		default:
			if err := b.add(ctx, insertTarget(r), r.Row); err != nil {
				return err
			}
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("restore: committing: %w", err)
	}
	// Statistics as a restored database would soon have them: the
	// rehearsal's plans and timings are those of a vacuumed database.
	if _, err := conn.Exec(ctx, "analyze"); err != nil {
		return fmt.Errorf("restore: analyze: %w", err)
	}
	return nil
}

// restorePrerequisites installs what the captured schemas stand on.
func restorePrerequisites(ctx context.Context, tx pgx.Tx, h Header) error {
	var hasPgflow, hasRealtime bool
	if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_namespace where nspname operator(pg_catalog.=) 'pgflow'),
			exists (select 1 from pg_catalog.pg_namespace where nspname operator(pg_catalog.=) 'realtime')`).Scan(&hasPgflow, &hasRealtime); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if hasPgflow {
		return fmt.Errorf("restore: %w", fixtures.ErrNotEmpty)
	}
	kind, err := fixtures.PGMQKind(ctx, tx)
	if err != nil {
		return err
	}
	if kind == "" {
		if _, err := fixtures.InstallPGMQ(ctx, tx); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	if err := matchPGMQ(ctx, tx, h.PGMQ); err != nil {
		return err
	}
	if !hasRealtime {
		if err := fixtures.InstallSupabaseStubs(ctx, tx); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if h.Release != nil {
			if err := restoreSupabase(ctx, tx, *h.Release); err != nil {
				return err
			}
		}
	}
	for _, e := range h.Extensions {
		var available bool
		if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_available_extensions where name operator(pg_catalog.=) $1)`, e.Name).Scan(&available); err != nil {
			return fmt.Errorf("restore: looking for extension %s: %w", e.Name, err)
		}
		if !available {
			return fmt.Errorf("restore: the captured schemas use extension %s, which this server does not offer: replay on a server that has it", e.Name)
		}
		schema := pgx.Identifier{e.Schema}.Sanitize()
		if _, err := tx.Exec(ctx, "create schema if not exists "+schema+"; create extension if not exists "+pgx.Identifier{e.Name}.Sanitize()+" with schema "+schema); err != nil {
			return fmt.Errorf("restore: creating extension %s in schema %s: %w", e.Name, e.Schema, err)
		}
	}
	// Roles are the server's, not the database's: a grant to a role this
	// server lacks needs the role. It is made NOLOGIN and kept.
	for _, role := range h.Roles {
		var exists bool
		if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_roles where rolname operator(pg_catalog.=) $1)`, role).Scan(&exists); err != nil {
			return fmt.Errorf("restore: looking for role %s: %w", role, err)
		}
		if exists {
			continue
		}
		if _, err := tx.Exec(ctx, "create role "+pgx.Identifier{role}.Sanitize()+" nologin"); err != nil {
			return fmt.Errorf("restore: creating role %s, which the captured grants name: %w (create it on the replay server first)", role, err)
		}
	}
	return nil
}

// restoreSupabase makes the Supabase stand-ins what the source's were for
// the plan that runs on the copy: the ledger records upstream's files as
// the source's did (the stand-ins' own ledger is 0.16.0's; no ledger when
// the source had none), and pg_net and the pg_cron stand-in are registered
// as extensions, as on a database upstream's files built, so that
// upstream's telemetry file finds them. Registering writes
// pg_catalog.pg_extension, which only a superuser may: for another role
// they stay unregistered (that file then needs the real extensions).
func restoreSupabase(ctx context.Context, tx pgx.Tx, r Release) error {
	if r.LedgerFiles < 0 {
		if _, err := tx.Exec(ctx, `drop schema supabase_migrations cascade`); err != nil {
			return fmt.Errorf("restore: removing the stand-ins' Supabase ledger (the source had none): %w", err)
		}
	} else {
		if _, err := tx.Exec(ctx, `delete from supabase_migrations.schema_migrations`); err != nil {
			return fmt.Errorf("restore: the Supabase ledger: %w", err)
		}
		for _, f := range versions.UpstreamFiles()[:r.LedgerFiles] {
			if _, err := tx.Exec(ctx, `insert into supabase_migrations.schema_migrations (version, name) values ($1, $2)`, f.Version(), f.Title()); err != nil {
				return fmt.Errorf("restore: recording upstream's %s in the Supabase ledger: %w", f.Name, err)
			}
		}
	}
	var super bool
	if err := tx.QueryRow(ctx, `select rolsuper from pg_catalog.pg_roles where rolname operator(pg_catalog.=) current_user`).Scan(&super); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if !super {
		return nil
	}
	var c upstreamdb.Components
	var err error
	if c.PGMQ, err = fixtures.PGMQKind(ctx, tx); err != nil {
		return err
	}
	if c.Cron, err = fixtures.CronKind(ctx, tx); err != nil {
		return err
	}
	if err := upstreamdb.RegisterStandIns(ctx, tx, c); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// restoreSeq sets a sequence where the source had it.
func restoreSeq(ctx context.Context, tx pgx.Tx, s SeqPos) error {
	var err error
	if s.Sequence != "" {
		_, err = tx.Exec(ctx, `select pg_catalog.setval($1::pg_catalog.regclass, $2, $3)`, s.Sequence, s.LastValue, s.IsCalled)
	} else {
		_, err = tx.Exec(ctx, `select pg_catalog.setval(pg_catalog.pg_get_serial_sequence($1, $2)::pg_catalog.regclass, $3, $4)`, s.Table, s.Column, s.LastValue, s.IsCalled)
	}
	if err != nil {
		return fmt.Errorf("restore: setting sequence %s%s to %d: %w", s.Sequence, s.Table, s.LastValue, err)
	}
	return nil
}

// insertColumns is the column list of an insert into table (a sanitized
// name): every column but generated ones, and whether an identity column
// needs OVERRIDING SYSTEM VALUE.
func insertColumns(ctx context.Context, tx pgx.Tx, table string) (string, error) {
	var cols string
	var identity bool
	err := tx.QueryRow(ctx, `select pg_catalog.string_agg(pg_catalog.quote_ident(a.attname), ', ' order by a.attnum),
			pg_catalog.bool_or(a.attidentity operator(pg_catalog.=) 'a')
		from pg_catalog.pg_attribute a where a.attrelid operator(pg_catalog.=) $1::pg_catalog.regclass
		  and a.attnum operator(pg_catalog.>) 0 and not a.attisdropped and a.attgenerated operator(pg_catalog.=) ''`, table).Scan(&cols, &identity)
	if err != nil {
		return "", fmt.Errorf("restore: reading the columns of %s: %w", table, err)
	}
	over := ""
	if identity {
		over = " overriding system value"
	}
	return "insert into " + table + " (" + cols + ")" + over + " select " + cols, nil
}

// insertSQL is the statement that inserts a JSON array of rows of target.
func (b *batch) insertSQL(ctx context.Context) (table, sql string, err error) {
	table, _, _ = strings.Cut(b.target, " overriding")
	if b.columns == nil { // version 1: the baseline's tables, all columns
		return table, "insert into " + b.target + " select * from pg_catalog.jsonb_populate_recordset(null::" + table + ", $1::pg_catalog.jsonb)", nil
	}
	head, ok := b.columns[table]
	if !ok {
		if head, err = insertColumns(ctx, b.tx, table); err != nil {
			return table, "", err
		}
		b.columns[table] = head
	}
	return table, head + " from pg_catalog.jsonb_populate_recordset(null::" + table + ", $1::pg_catalog.jsonb)", nil
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// matchPGMQ takes the restored database's pgmq to the version the capture
// was taken on, before any queue is created (from 1.10.0 the queue tables
// have last_read_at, which the captured messages carry): ALTER EXTENSION
// pgmq UPDATE when the server offers that version. A server that cannot is
// refused, saying what it lacks, instead of rehearsing on another pgmq.
// A capture of an older pgmq than the server installs is restored as
// before (extensions are not downgraded).
func matchPGMQ(ctx context.Context, tx pgx.Tx, captured string) error {
	v, ok := strings.CutPrefix(captured, "extension ")
	if !ok {
		return nil // the stand-in's capture: nothing to match
	}
	want, err := pgmqver.Parse(v)
	if err != nil {
		return fmt.Errorf("restore: %w: the capture's pgmq version %q", ErrBadCapture, v)
	}
	var installed, newest string
	if err := tx.QueryRow(ctx, `select coalesce((select extversion from pg_catalog.pg_extension where extname operator(pg_catalog.=) 'pgmq'), ''),
			coalesce((select pg_catalog.string_agg(version, ', ' order by pg_catalog.string_to_array(version, '.')::int[])
			          from pg_catalog.pg_available_extension_versions
			          where name operator(pg_catalog.=) 'pgmq' and version operator(pg_catalog.~) '^[0-9]+(\.[0-9]+){1,2}$'), '')`).Scan(&installed, &newest); err != nil {
		return fmt.Errorf("restore: reading this server's pgmq: %w", err)
	}
	have, err := pgmqver.Parse(installed)
	if installed == "" || err != nil {
		if want == pgmqver.MustParse("1.5.1") {
			return nil // the stand-in stands for 1.5.1
		}
		return fmt.Errorf("restore: the capture was taken on pgmq %s and this server has no pgmq extension (the project's stand-in is 1.5.1): rehearse on a server that offers pgmq %s", want, want)
	}
	if !have.Less(want) {
		return nil
	}
	offered := slices.Contains(strings.Split(newest, ", "), want.String())
	if !offered {
		return fmt.Errorf("restore: the capture was taken on pgmq %s; this server installs pgmq %s and offers only %s: install pgmq's update scripts up to %s "+
			"(pgmq--%s--...--%s.sql in its extension directory; scripts/setup.sh does it from ../shared/vendor/pgmq-updates-1.13.1), or rehearse on a server that offers it",
			want, have, newest, want, have, want)
	}
	// The version passed pgmqver.Parse: digits and dots only.
	if _, err := tx.Exec(ctx, `alter extension pgmq update to '`+want.String()+`'`); err != nil {
		return fmt.Errorf("restore: updating pgmq %s to the capture's %s: %w", have, want, err)
	}
	return nil
}
