package capture

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The DDL of a capture (version 2): the captured schemas rebuilt from the
// server's own catalog, the way pg_dump splits it. The "pre" section makes
// what rows need (schemas, types, tables without their constraints,
// sequences, functions, column defaults, views); rows are loaded next, into
// tables with no constraint, index or trigger yet; the "post" section then
// adds constraints (primary and unique keys before foreign keys), indexes,
// triggers, row security, grants and comments. Every statement is printed
// by the server (pg_get_*def, format_type, pg_get_expr) with search_path
// empty, so every name outside pg_catalog carries its schema.
//
// Not rebuilt (docs/runbook.md "Rehearse"): owners (the replaying role owns
// everything), default privileges, aggregates, partitioned tables,
// extension-owned objects (an extension the schemas depend on must be on
// the replay server), security labels.

// ddlStep is one query printing statements of one kind, in order.
type ddlStep struct {
	what string
	sql  string
}

// notExtensionMember: objects an extension owns are the extension's, not
// the schema's (they come back with the extension).
const notExtensionMember = `not exists (select 1 from pg_catalog.pg_depend d where d.classid = %s::pg_catalog.regclass and d.objid = %s and d.deptype = 'e')`

func notExt(classid, objid string) string {
	return fmt.Sprintf(notExtensionMember, "'"+classid+"'", objid)
}

var preDDL = []ddlStep{
	{"schemas", `select pg_catalog.format('create schema if not exists %I', n.nspname)
		from pg_catalog.pg_namespace n where n.nspname operator(pg_catalog.=) any ($1) order by pg_catalog.array_position($1, n.nspname::text)`},
	{"enums", `select pg_catalog.format('create type %I.%I as enum (%s)', n.nspname, t.typname,
			(select pg_catalog.string_agg(pg_catalog.quote_literal(e.enumlabel), ', ' order by e.enumsortorder) from pg_catalog.pg_enum e where e.enumtypid operator(pg_catalog.=) t.oid))
		from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and t.typtype operator(pg_catalog.=) 'e' and ` + "NOTEXT_TYPE" + ` order by t.oid`},
	{"domains", `select pg_catalog.format('create domain %I.%I as %s%s%s', n.nspname, t.typname, pg_catalog.format_type(t.typbasetype, t.typtypmod),
			coalesce(' default ' operator(pg_catalog.||) t.typdefault, ''), case when t.typnotnull then ' not null' else '' end)
		from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and t.typtype operator(pg_catalog.=) 'd' and ` + "NOTEXT_TYPE" + ` order by t.oid`},
	{"composite types", `select pg_catalog.format('create type %I.%I as (%s)', n.nspname, c.relname,
			coalesce((select pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)), ', ' order by a.attnum)
				from pg_catalog.pg_attribute a where a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.>) 0 and not a.attisdropped), ''))
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		join pg_catalog.pg_type t on t.oid operator(pg_catalog.=) c.reltype
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'c' and ` + "NOTEXT_TYPE" + ` order by c.oid`},
	// Sequences that are not a column's identity (those come with their table).
	{"sequences", `select pg_catalog.format('create sequence %I.%I as %s increment by %s minvalue %s maxvalue %s start with %s cache %s%s',
			n.nspname, c.relname, pg_catalog.format_type(s.seqtypid, null), s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache,
			case when s.seqcycle then ' cycle' else '' end)
		from pg_catalog.pg_sequence s join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) s.seqrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and ` + "NOTEXT_CLASS" + `
		  and not exists (select 1 from pg_catalog.pg_depend d where d.classid operator(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
		                  and d.objid operator(pg_catalog.=) c.oid and d.deptype operator(pg_catalog.=) 'i')
		order by c.oid`},
	// Tables: columns with type, collation, identity, generation and NOT NULL;
	// defaults come after the functions they may call.
	{"tables", `select pg_catalog.format('create %stable %I.%I (%s)%s', case c.relpersistence when 'u' then 'unlogged ' else '' end, n.nspname, c.relname,
			coalesce((select pg_catalog.string_agg(pg_catalog.format('%I %s', a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod))
					operator(pg_catalog.||) case when a.attcollation operator(pg_catalog.<>) 0 and a.attcollation operator(pg_catalog.<>) ty.typcollation
						then (select pg_catalog.format(' collate %I.%I', cn.nspname, co.collname) from pg_catalog.pg_collation co
						      join pg_catalog.pg_namespace cn on cn.oid operator(pg_catalog.=) co.collnamespace where co.oid operator(pg_catalog.=) a.attcollation) else '' end
					operator(pg_catalog.||) case when a.attidentity operator(pg_catalog.<>) '' then
						(select pg_catalog.format(' generated %s as identity (sequence name %I.%I increment by %s minvalue %s maxvalue %s start with %s cache %s%s)',
							case a.attidentity when 'a' then 'always' else 'by default' end, sn.nspname, sc.relname,
							s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache, case when s.seqcycle then ' cycle' else '' end)
						 from pg_catalog.pg_depend d join pg_catalog.pg_sequence s on s.seqrelid operator(pg_catalog.=) d.objid
						 join pg_catalog.pg_class sc on sc.oid operator(pg_catalog.=) s.seqrelid join pg_catalog.pg_namespace sn on sn.oid operator(pg_catalog.=) sc.relnamespace
						 where d.refobjid operator(pg_catalog.=) c.oid and d.refobjsubid operator(pg_catalog.=) a.attnum and d.deptype operator(pg_catalog.=) 'i'
						   and d.classid operator(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass limit 1) else '' end
					operator(pg_catalog.||) case when a.attgenerated operator(pg_catalog.=) 's'
						then ' generated always as (' operator(pg_catalog.||) pg_catalog.pg_get_expr(ad.adbin, ad.adrelid) operator(pg_catalog.||) ') stored' else '' end
					operator(pg_catalog.||) case when a.attnotnull then ' not null' else '' end, ', ' order by a.attnum)
				from pg_catalog.pg_attribute a join pg_catalog.pg_type ty on ty.oid operator(pg_catalog.=) a.atttypid
				left join pg_catalog.pg_attrdef ad on ad.adrelid operator(pg_catalog.=) a.attrelid and ad.adnum operator(pg_catalog.=) a.attnum
				where a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.>) 0 and not a.attisdropped), ''),
			coalesce(' with (' operator(pg_catalog.||) pg_catalog.array_to_string(c.reloptions, ', ') operator(pg_catalog.||) ')', ''))
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'r' and not c.relispartition and ` + "NOTEXT_CLASS" + `
		order by c.oid`},
	{"sequence ownership", `select pg_catalog.format('alter sequence %I.%I owned by %I.%I.%I', n.nspname, c.relname, tn.nspname, t.relname, a.attname)
		from pg_catalog.pg_depend d join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) d.objid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		join pg_catalog.pg_class t on t.oid operator(pg_catalog.=) d.refobjid join pg_catalog.pg_namespace tn on tn.oid operator(pg_catalog.=) t.relnamespace
		join pg_catalog.pg_attribute a on a.attrelid operator(pg_catalog.=) t.oid and a.attnum operator(pg_catalog.=) d.refobjsubid
		where d.classid operator(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass and d.refclassid operator(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
		  and c.relkind operator(pg_catalog.=) 'S' and d.deptype operator(pg_catalog.=) 'a' and n.nspname operator(pg_catalog.=) any ($1)
		order by c.oid`},
	// Functions and procedures as pg_get_functiondef prints them (with their
	// SET search_path); bodies are not checked until every table exists.
	{"functions", `select pg_catalog.pg_get_functiondef(p.oid)
		from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
		where n.nspname operator(pg_catalog.=) any ($1) and p.prokind operator(pg_catalog.<>) 'a' and ` + "NOTEXT_PROC" + ` order by p.oid`},
	{"domain checks", `select pg_catalog.format('alter domain %I.%I add constraint %I %s', n.nspname, t.typname, k.conname, pg_catalog.pg_get_constraintdef(k.oid))
		from pg_catalog.pg_constraint k join pg_catalog.pg_type t on t.oid operator(pg_catalog.=) k.contypid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and k.contype operator(pg_catalog.=) 'c' and ` + "NOTEXT_TYPE" + ` order by k.oid`},
	{"column defaults", `select pg_catalog.format('alter table %I.%I alter column %I set default %s', n.nspname, c.relname, a.attname, pg_catalog.pg_get_expr(ad.adbin, ad.adrelid))
		from pg_catalog.pg_attrdef ad join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) ad.adrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		join pg_catalog.pg_attribute a on a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.=) ad.adnum
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'r' and a.attgenerated operator(pg_catalog.=) '' and not a.attisdropped and ` + "NOTEXT_CLASS" + `
		order by c.oid, a.attnum`},
	{"views", `select pg_catalog.format('create %sview %I.%I%s as %s%s', case c.relkind when 'm' then 'materialized ' else '' end, n.nspname, c.relname,
			coalesce(' with (' operator(pg_catalog.||) pg_catalog.array_to_string(c.reloptions, ', ') operator(pg_catalog.||) ')', ''),
			pg_catalog.rtrim(pg_catalog.pg_get_viewdef(c.oid), ';'), case c.relkind when 'm' then ' with no data' else '' end)
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) any (array['v', 'm']::"char"[]) and ` + "NOTEXT_CLASS" + `
		order by c.oid`},
}

var postDDL = []ddlStep{
	// Keys first (foreign keys need them), then checks and exclusions, then
	// foreign keys.
	{"constraints", `select pg_catalog.format('alter table %I.%I add constraint %I %s', n.nspname, c.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid))
		from pg_catalog.pg_constraint k join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) k.conrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'r' and ` + "NOTEXT_CLASS" + `
		order by case k.contype when 'p' then 0 when 'u' then 1 when 'f' then 3 else 2 end, k.oid`},
	{"indexes", `select pg_catalog.pg_get_indexdef(i.indexrelid)
		from pg_catalog.pg_index i join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) i.indrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) any (array['r', 'm']::"char"[]) and ` + "NOTEXT_CLASS" + `
		  and not exists (select 1 from pg_catalog.pg_constraint k where k.conindid operator(pg_catalog.=) i.indexrelid and k.conrelid operator(pg_catalog.=) i.indrelid)
		order by i.indexrelid`},
	{"materialized view data", `select pg_catalog.format('refresh materialized view %I.%I', n.nspname, c.relname)
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'm' and c.relispopulated and ` + "NOTEXT_CLASS" + ` order by c.oid`},
	{"triggers", `select pg_catalog.pg_get_triggerdef(g.oid) operator(pg_catalog.||) case g.tgenabled
				when 'D' then pg_catalog.format('; alter table %I.%I disable trigger %I', n.nspname, c.relname, g.tgname)
				when 'R' then pg_catalog.format('; alter table %I.%I enable replica trigger %I', n.nspname, c.relname, g.tgname)
				when 'A' then pg_catalog.format('; alter table %I.%I enable always trigger %I', n.nspname, c.relname, g.tgname) else '' end
		from pg_catalog.pg_trigger g join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) g.tgrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and not g.tgisinternal and ` + "NOTEXT_CLASS" + ` order by g.oid`},
	{"row security", `select pg_catalog.format('alter table %I.%I %s row level security', n.nspname, c.relname, x.how)
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace,
		lateral (values ('enable', c.relrowsecurity), ('force', c.relforcerowsecurity)) x(how, wanted)
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) 'r' and x.wanted and ` + "NOTEXT_CLASS" + ` order by c.oid, x.how desc`},
	{"policies", `select pg_catalog.format('create policy %I on %I.%I as %s for %s to %s%s%s', p.polname, n.nspname, c.relname,
			case when p.polpermissive then 'permissive' else 'restrictive' end,
			case p.polcmd when 'r' then 'select' when 'a' then 'insert' when 'w' then 'update' when 'd' then 'delete' else 'all' end,
			coalesce((select pg_catalog.string_agg(case when r.oid operator(pg_catalog.=) 0 then 'public' else pg_catalog.quote_ident(a.rolname) end, ', ')
				from pg_catalog.unnest(p.polroles) r(oid) left join pg_catalog.pg_roles a on a.oid operator(pg_catalog.=) r.oid), 'public'),
			coalesce(' using (' operator(pg_catalog.||) pg_catalog.pg_get_expr(p.polqual, p.polrelid) operator(pg_catalog.||) ')', ''),
			coalesce(' with check (' operator(pg_catalog.||) pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) operator(pg_catalog.||) ')', ''))
		from pg_catalog.pg_policy p join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) p.polrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) order by p.oid`},
	{"grants", grantsSQL},
	{"comments", commentsSQL},
}

// grantsSQL prints the privileges of aclexplode, except the owner's own
// (the replaying role owns everything). Functions and types give EXECUTE
// and USAGE to PUBLIC by default: an ACL without PUBLIC revokes it first.
const grantsSQL = `with objs as (
		select 'schema' as kind, pg_catalog.quote_ident(n.nspname) as name, n.nspacl as acl, n.nspowner as owner, 0 as ord, n.oid::pg_catalog.int8 as id, false as public_default
		from pg_catalog.pg_namespace n where n.nspname operator(pg_catalog.=) any ($1)
		union all
		select case c.relkind when 'S' then 'sequence' else 'table' end, pg_catalog.format('%I.%I', n.nspname, c.relname), c.relacl, c.relowner, 1, c.oid::pg_catalog.int8, false
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and c.relkind operator(pg_catalog.=) any (array['r', 'v', 'm', 'S']::"char"[]) and NOTEXT_CLASS
		union all
		select 'routine', pg_catalog.format('%I.%I(%s)', n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)), p.proacl, p.proowner, 2, p.oid::pg_catalog.int8, true
		from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
		where n.nspname operator(pg_catalog.=) any ($1) and p.prokind operator(pg_catalog.<>) 'a' and NOTEXT_PROC
		union all
		select case t.typtype when 'd' then 'domain' else 'type' end, pg_catalog.format('%I.%I', n.nspname, t.typname), t.typacl, t.typowner, 3, t.oid::pg_catalog.int8, true
		from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace
		where n.nspname operator(pg_catalog.=) any ($1) and t.typtype operator(pg_catalog.=) any (array['e', 'd']::"char"[]) and NOTEXT_TYPE
	), stmts as (
		select o.ord, o.id, 0 as sub, pg_catalog.format('revoke all on %s %s from public', o.kind, o.name) as stmt
		from objs o where o.acl is not null and o.public_default
		  and not exists (select 1 from pg_catalog.aclexplode(o.acl) x where x.grantee operator(pg_catalog.=) 0)
		union all
		select o.ord, o.id, 1, pg_catalog.format('grant %s on %s %s to %s%s', x.privilege_type, o.kind, o.name,
			case when x.grantee operator(pg_catalog.=) 0 then 'public' else pg_catalog.quote_ident(r.rolname) end,
			case when x.is_grantable then ' with grant option' else '' end)
		from objs o cross join lateral pg_catalog.aclexplode(o.acl) x
		left join pg_catalog.pg_roles r on r.oid operator(pg_catalog.=) x.grantee
		where x.grantee operator(pg_catalog.<>) o.owner and not (o.public_default and x.grantee operator(pg_catalog.=) 0 and x.privilege_type operator(pg_catalog.=) any (array['EXECUTE', 'USAGE']))
		union all
		select 1, c.oid::pg_catalog.int8, 2, pg_catalog.format('grant %s (%I) on table %I.%I to %s%s', x.privilege_type, a.attname, n.nspname, c.relname,
			case when x.grantee operator(pg_catalog.=) 0 then 'public' else pg_catalog.quote_ident(r.rolname) end,
			case when x.is_grantable then ' with grant option' else '' end)
		from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) a.attrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		cross join lateral pg_catalog.aclexplode(a.attacl) x left join pg_catalog.pg_roles r on r.oid operator(pg_catalog.=) x.grantee
		where n.nspname operator(pg_catalog.=) any ($1) and a.attacl is not null and not a.attisdropped and NOTEXT_CLASS
	)
	select stmt from stmts order by ord, id, sub, stmt`

// commentsSQL prints the comments of the schemas' objects.
const commentsSQL = `with c as (
		select 0 as ord, n.oid::pg_catalog.int8 as id, 0 as sub, pg_catalog.format('comment on schema %I is %L', n.nspname, d.description) as stmt
		from pg_catalog.pg_namespace n join pg_catalog.pg_description d on d.objoid operator(pg_catalog.=) n.oid and d.classoid operator(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
		where n.nspname operator(pg_catalog.=) any ($1)
		union all
		select 1, c.oid::pg_catalog.int8, d.objsubid, case when d.objsubid operator(pg_catalog.=) 0
				then pg_catalog.format('comment on %s %I.%I is %L', case c.relkind when 'v' then 'view' when 'm' then 'materialized view' when 'S' then 'sequence' when 'i' then 'index' when 'c' then 'type' else 'table' end, n.nspname, c.relname, d.description)
				else pg_catalog.format('comment on column %I.%I.%I is %L', n.nspname, c.relname, a.attname, d.description) end
		from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		join pg_catalog.pg_description d on d.objoid operator(pg_catalog.=) c.oid and d.classoid operator(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
		left join pg_catalog.pg_attribute a on a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.=) d.objsubid
		where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_CLASS and (d.objsubid operator(pg_catalog.=) 0 or not a.attisdropped)
		union all
		select 2, p.oid::pg_catalog.int8, 0, pg_catalog.format('comment on routine %I.%I(%s) is %L', n.nspname, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid), d.description)
		from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
		join pg_catalog.pg_description d on d.objoid operator(pg_catalog.=) p.oid and d.classoid operator(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
		where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_PROC
		union all
		select 3, t.oid::pg_catalog.int8, 0, pg_catalog.format('comment on %s %I.%I is %L', case t.typtype when 'd' then 'domain' else 'type' end, n.nspname, t.typname, d.description)
		from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) t.typnamespace
		join pg_catalog.pg_description d on d.objoid operator(pg_catalog.=) t.oid and d.classoid operator(pg_catalog.=) 'pg_catalog.pg_type'::pg_catalog.regclass
		where n.nspname operator(pg_catalog.=) any ($1) and t.typtype operator(pg_catalog.=) any (array['e', 'd']::"char"[]) and NOTEXT_TYPE
		union all
		select 4, k.oid::pg_catalog.int8, 0, pg_catalog.format('comment on constraint %I on %I.%I is %L', k.conname, n.nspname, c.relname, d.description)
		from pg_catalog.pg_constraint k join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) k.conrelid
		join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		join pg_catalog.pg_description d on d.objoid operator(pg_catalog.=) k.oid and d.classoid operator(pg_catalog.=) 'pg_catalog.pg_constraint'::pg_catalog.regclass
		where n.nspname operator(pg_catalog.=) any ($1) and NOTEXT_CLASS
	)
	select stmt from c order by ord, id, sub`

// expand fills in the extension-member filters.
func expand(sql string) string {
	r := map[string]string{
		"NOTEXT_CLASS": notExt("pg_catalog.pg_class", "c.oid"),
		"NOTEXT_TYPE":  notExt("pg_catalog.pg_type", "t.oid"),
		"NOTEXT_PROC":  notExt("pg_catalog.pg_proc", "p.oid"),
	}
	for k, v := range r {
		sql = strings.ReplaceAll(sql, k, v)
	}
	return sql
}

// schemaDDL runs the steps on q (the capture's snapshot, search_path empty)
// and calls emit with each statement in order.
func schemaDDL(ctx context.Context, tx pgx.Tx, schemas []string, steps []ddlStep, emit func(stmt string) error) error {
	for _, s := range steps {
		rows, err := tx.Query(ctx, expand(s.sql), schemas)
		if err != nil {
			return fmt.Errorf("capture: reading the %s of schemas %v from the catalog: %w", s.what, schemas, err)
		}
		stmts, err := pgx.CollectRows(rows, pgx.RowTo[*string])
		if err != nil {
			return fmt.Errorf("capture: reading the %s of schemas %v from the catalog: %w", s.what, schemas, err)
		}
		for _, st := range stmts {
			if st == nil || *st == "" {
				continue
			}
			if err := emit(*st); err != nil {
				return err
			}
		}
	}
	return nil
}
