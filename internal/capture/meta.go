package capture

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// What a version 2 capture says about its source besides the rows: the
// schemas, versions, roles and table sizes (Header), and the sequence
// positions.

// describe fills the header's schemas, versions and roles; d is the
// detection of the snapshot's pgflow.
func describe(ctx context.Context, tx pgx.Tx, h *Header, include []string, d *versions.Detection) error {
	h.Schemas = []string{"pgflow"}
	seen := map[string]bool{"pgflow": true}
	// Upstream's files from 0.17.1 on build a second schema: it is
	// pgflow's, and the hops after it change it.
	var telemetry bool
	if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_namespace where nspname operator(pg_catalog.=) $1)`, telemetrySchema).Scan(&telemetry); err != nil {
		return fmt.Errorf("capture: looking for schema %s: %w", telemetrySchema, err)
	}
	if telemetry {
		h.Schemas, seen[telemetrySchema] = append(h.Schemas, telemetrySchema), true
	}
	for _, s := range include {
		if reservedSchemas[s] {
			return fmt.Errorf("capture: --include-schema %s: that schema is always captured or rebuilt by its owner; name a schema of your own", s)
		}
		if seen[s] {
			continue
		}
		seen[s] = true
		var exists bool
		if err := tx.QueryRow(ctx, `select exists (select 1 from pg_catalog.pg_namespace where nspname operator(pg_catalog.=) $1)`, s).Scan(&exists); err != nil {
			return fmt.Errorf("capture: looking for schema %s: %w", s, err)
		}
		if !exists {
			return fmt.Errorf("capture: --include-schema %s: the database has no such schema (names are case-sensitive)", s)
		}
		h.Schemas = append(h.Schemas, s)
	}
	// Partitioned and inheriting tables are not rebuilt: refuse rather
	// than capture a parent's rows twice or a partition's DDL wrong.
	var odd *string
	if err := tx.QueryRow(ctx, `select pg_catalog.string_agg(pg_catalog.format('%I.%I', n.nspname, c.relname), ', ')
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and (c.relkind operator(pg_catalog.=) 'p' or c.relispartition
		   or exists (select 1 from pg_catalog.pg_inherits i where i.inhrelid operator(pg_catalog.=) c.oid or i.inhparent operator(pg_catalog.=) c.oid))`, h.Schemas).Scan(&odd); err != nil {
		return fmt.Errorf("capture: looking for partitioned tables: %w", err)
	}
	if odd != nil {
		return fmt.Errorf("capture: %s: partitioned or inheriting tables cannot be captured and rebuilt (leave that schema out)", *odd)
	}
	if err := tx.QueryRow(ctx, `select pg_catalog.current_setting('server_version'),
			coalesce((select 'extension ' operator(pg_catalog.||) extversion from pg_catalog.pg_extension where extname operator(pg_catalog.=) 'pgmq'), 'stand-in')`).
		Scan(&h.ServerVersion, &h.PGMQ); err != nil {
		return fmt.Errorf("capture: reading the server and pgmq versions: %w", err)
	}
	h.PgflowVersion = d.Found
	rows, err := tx.Query(ctx, extensionsSQL, h.Schemas)
	if err != nil {
		return fmt.Errorf("capture: reading the extensions the schemas use: %w", err)
	}
	if h.Extensions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Extension]); err != nil {
		return fmt.Errorf("capture: reading the extensions the schemas use: %w", err)
	}
	rows, err = tx.Query(ctx, expand(rolesSQL), h.Schemas)
	if err != nil {
		return fmt.Errorf("capture: reading the roles the grants name: %w", err)
	}
	if h.Roles, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return fmt.Errorf("capture: reading the roles the grants name: %w", err)
	}
	return nil
}

// extensionsSQL: the extensions (pgmq and plpgsql aside) that own an
// object the schemas' tables, columns, defaults, constraints, views,
// functions or types depend on.
const extensionsSQL = `with objs as (
		select 'pg_catalog.pg_class'::pg_catalog.regclass as classid, c.oid as objid from pg_catalog.pg_class c
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace where n.nspname operator(pg_catalog.=) any ($1)
		union all select 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid from pg_catalog.pg_proc p
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace where n.nspname operator(pg_catalog.=) any ($1)
		union all select 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid from pg_catalog.pg_type t
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace where n.nspname operator(pg_catalog.=) any ($1)
		union all select 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid from pg_catalog.pg_constraint k
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) k.connamespace where n.nspname operator(pg_catalog.=) any ($1)
		union all select 'pg_catalog.pg_attrdef'::pg_catalog.regclass, ad.oid from pg_catalog.pg_attrdef ad
			join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) ad.adrelid
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace where n.nspname operator(pg_catalog.=) any ($1)
		union all select 'pg_catalog.pg_rewrite'::pg_catalog.regclass, r.oid from pg_catalog.pg_rewrite r
			join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) r.ev_class
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace where n.nspname operator(pg_catalog.=) any ($1)
	)
	select distinct e.extname::text, en.nspname::text
	from objs o join pg_catalog.pg_depend d on d.classid operator(pg_catalog.=) o.classid and d.objid operator(pg_catalog.=) o.objid
	join pg_catalog.pg_depend x on x.classid operator(pg_catalog.=) d.refclassid and x.objid operator(pg_catalog.=) d.refobjid and x.deptype operator(pg_catalog.=) 'e'
	join pg_catalog.pg_extension e on e.oid operator(pg_catalog.=) x.refobjid
	join pg_catalog.pg_namespace en on en.oid operator(pg_catalog.=) e.extnamespace
	where e.extname operator(pg_catalog.<>) all (array['pgmq', 'plpgsql'])
	order by 1`

// rolesSQL: every role a grant or policy of the schemas names, but the
// owners (the replaying role stands in for them).
const rolesSQL = `with acls as (
		select n.nspacl as acl, n.nspowner as owner from pg_catalog.pg_namespace n where n.nspname operator(pg_catalog.=) any ($1)
		union all select c.relacl, c.relowner from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_CLASS
		union all select a.attacl, c.relowner from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) a.attrelid join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace where n.nspname operator(pg_catalog.=) any ($1) and a.attacl is not null and NOTEXT_CLASS
		union all select p.proacl, p.proowner from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_PROC
		union all select t.typacl, t.typowner from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_TYPE
	), named as (
		select x.grantee from acls cross join lateral pg_catalog.aclexplode(acls.acl) x where acls.acl is not null and x.grantee operator(pg_catalog.<>) acls.owner
		union select r.oid from pg_catalog.pg_policy p join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) p.polrelid
			join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace cross join lateral pg_catalog.unnest(p.polroles) r(oid)
			where n.nspname operator(pg_catalog.=) any ($1)
	)
	select distinct r.rolname::text from named join pg_catalog.pg_roles r on r.oid operator(pg_catalog.=) named.grantee order by 1`

// telemetrySchema is the schema upstream's telemetry file (0.17.1) makes;
// a capture holds it with pgflow when the database has it.
const telemetrySchema = "pgflow_telemetry"

// physQueue is one physical pgmq queue: its tables are q_<phys>, a_<phys>.
type physQueue struct{ name, phys string }

// physicalQueues keeps one name per physical queue (case-only aliases share one).
func physicalQueues(queues []string) []physQueue {
	var out []physQueue
	seen := map[string]bool{}
	for _, q := range queues {
		p := strings.ToLower(q)
		if !seen[p] {
			seen[p] = true
			out = append(out, physQueue{q, p})
		}
	}
	return out
}

// tableStats lists the captured tables (schemas' ordinary tables, pgmq's
// queue tables) with exact counts (the capture reads every row anyway) and
// sizes.
func tableStats(ctx context.Context, tx pgx.Tx, h *Header, queues []physQueue) error {
	rows, err := tx.Query(ctx, `select n.nspname::text, c.relname::text from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'r' and not c.relispartition and `+expand("NOTEXT_CLASS")+`
		order by pg_catalog.array_position($1, n.nspname::text), c.oid`, h.Schemas)
	if err != nil {
		return fmt.Errorf("capture: listing the tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgx.Identifier, error) {
		var s, t string
		err := r.Scan(&s, &t)
		return pgx.Identifier{s, t}, err
	})
	if err != nil {
		return fmt.Errorf("capture: listing the tables: %w", err)
	}
	for _, q := range queues {
		names = append(names, pgx.Identifier{"pgmq", "q_" + q.phys}, pgx.Identifier{"pgmq", "a_" + q.phys})
	}
	for _, id := range names {
		st := TableStat{Table: id[0] + "." + id[1]}
		if err := tx.QueryRow(ctx, "select pg_catalog.count(*), pg_catalog.pg_total_relation_size($1::pg_catalog.regclass) from "+id.Sanitize(), id.Sanitize()).
			Scan(&st.Rows, &st.Bytes); err != nil {
			return fmt.Errorf("capture: counting %s: %w", st.Table, err)
		}
		if id[0] != "pgmq" {
			rows, err := tx.Query(ctx, `select a.attname::text from pg_catalog.pg_attribute a
				where a.attrelid operator(pg_catalog.=) $1::pg_catalog.regclass and a.attnum operator(pg_catalog.>) 0
				  and not a.attisdropped and a.attgenerated operator(pg_catalog.=) '' order by a.attnum`, id.Sanitize())
			if err != nil {
				return fmt.Errorf("capture: reading the columns of %s: %w", st.Table, err)
			}
			if st.Columns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return fmt.Errorf("capture: reading the columns of %s: %w", st.Table, err)
			}
		}
		h.Tables = append(h.Tables, st)
	}
	return nil
}

// sequencePositions reads every sequence of the schemas and the msg_id
// sequence of every queue.
func sequencePositions(ctx context.Context, tx pgx.Tx, schemas []string, queues []physQueue) ([]SeqPos, error) {
	rows, err := tx.Query(ctx, `select n.nspname::text, c.relname::text from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'S' and `+expand("NOTEXT_CLASS")+` order by c.oid`, schemas)
	if err != nil {
		return nil, fmt.Errorf("capture: listing the sequences: %w", err)
	}
	type seq struct {
		id  pgx.Identifier
		pos SeqPos
	}
	seqs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (seq, error) {
		var s, n string
		err := r.Scan(&s, &n)
		return seq{id: pgx.Identifier{s, n}, pos: SeqPos{Sequence: pgx.Identifier{s, n}.Sanitize()}}, err
	})
	if err != nil {
		return nil, fmt.Errorf("capture: listing the sequences: %w", err)
	}
	for _, q := range queues {
		table := pgx.Identifier{"pgmq", "q_" + q.phys}.Sanitize()
		var s, n *string
		if err := tx.QueryRow(ctx, `select sn.nspname::text, sc.relname::text from pg_catalog.pg_class sc
				join pg_catalog.pg_namespace sn on sn.oid operator(pg_catalog.=) sc.relnamespace
				where sc.oid operator(pg_catalog.=) pg_catalog.pg_get_serial_sequence($1, 'msg_id')::pg_catalog.regclass`, table).Scan(&s, &n); err != nil && err != pgx.ErrNoRows {
			return nil, fmt.Errorf("capture: finding the message id sequence of %s: %w", table, err)
		}
		if s == nil || n == nil {
			continue
		}
		seqs = append(seqs, seq{id: pgx.Identifier{*s, *n}, pos: SeqPos{Table: table, Column: "msg_id"}})
	}
	out := make([]SeqPos, 0, len(seqs))
	for _, s := range seqs {
		if err := tx.QueryRow(ctx, "select last_value, is_called from "+s.id.Sanitize()).Scan(&s.pos.LastValue, &s.pos.IsCalled); err != nil {
			return nil, fmt.Errorf("capture: reading sequence %s: %w", s.id.Sanitize(), err)
		}
		out = append(out, s.pos)
	}
	return out, nil
}
