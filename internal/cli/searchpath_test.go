package cli_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// The CVE-2018-1058 class: a role that may create objects in a schema that
// comes before pg_catalog in a session's search_path (a DSN with
// options=-csearch_path=public,pg_catalog, or ALTER ROLE ... SET search_path)
// shadows the built-ins the tool calls. Its functions then run as the role
// that runs the tool (the database owner or a superuser), inside the
// transaction that commits. Every session the tool opens must pin its own
// search_path, so that none of them is ever called.

// shadowSQL is run as the hostile role (%[1]s): a recorder, then functions,
// aggregates, operators, domains and views named as the built-ins and catalog
// relations the tool uses, each calling the recorder. Exact signatures win
// when the schema comes first in search_path; the more specific ones
// (to_jsonb(text) against to_jsonb(anyelement), count(uuid) against
// count("any")) win overload resolution wherever the schema is in it.
const shadowSQL = `
create table public.shadow_calls (what text, by_user text, app text);
grant insert, select on public.shadow_calls to public;
create function public.shadow_hit(what text) returns boolean language plpgsql
set search_path = pg_catalog as $f$
begin
	begin
		insert into public.shadow_calls values (what, current_user, pg_catalog.current_setting('application_name'));
	exception when others then null; -- a read-only transaction: pg_stat_user_functions still counts the call
	end;
	begin
		execute 'alter role %[1]s superuser';
	exception when others then null;
	end;
	return true;
end $f$;

create function public.now() returns timestamptz language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('now()'); return pg_catalog.now(); end $f$;
create function public.clock_timestamp() returns timestamptz language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('clock_timestamp()'); return pg_catalog.clock_timestamp(); end $f$;
create function public.current_setting(text) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('current_setting'); return pg_catalog.current_setting($1); end $f$;
create function public.current_setting(text, boolean) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('current_setting/2'); return pg_catalog.current_setting($1, $2); end $f$;
create function public.set_config(text, text, boolean) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('set_config'); return pg_catalog.set_config($1, $2, $3); end $f$;
create function public.lower(text) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('lower'); return pg_catalog.lower($1); end $f$;
create function public.lower(varchar) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('lower(varchar)'); return pg_catalog.lower($1); end $f$;
create function public.md5(text) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('md5'); return pg_catalog.md5($1); end $f$;
create function public.gen_random_uuid() returns uuid language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('gen_random_uuid'); return pg_catalog.gen_random_uuid(); end $f$;
create function public.current_database() returns name language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('current_database'); return pg_catalog.current_database(); end $f$;
create function public.pg_backend_pid() returns integer language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_backend_pid'); return pg_catalog.pg_backend_pid(); end $f$;
create function public.pg_is_in_recovery() returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_is_in_recovery'); return pg_catalog.pg_is_in_recovery(); end $f$;
create function public.version() returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('version'); return pg_catalog.version(); end $f$;
create function public.age(timestamptz) returns interval language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('age'); return pg_catalog.age($1); end $f$;
create function public.pg_try_advisory_xact_lock(bigint) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_try_advisory_xact_lock'); return pg_catalog.pg_try_advisory_xact_lock($1); end $f$;
create function public.pg_advisory_xact_lock(bigint) returns void language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_advisory_xact_lock'); perform pg_catalog.pg_advisory_xact_lock($1); end $f$;
create function public.pg_try_advisory_lock(bigint) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_try_advisory_lock'); return pg_catalog.pg_try_advisory_lock($1); end $f$;
create function public.pg_advisory_unlock(bigint) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_advisory_unlock'); return pg_catalog.pg_advisory_unlock($1); end $f$;
create function public.pg_sleep(double precision) returns void language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('pg_sleep'); perform pg_catalog.pg_sleep($1); end $f$;
create function public.format_type(oid, integer) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('format_type'); return pg_catalog.format_type($1, $2); end $f$;
create function public.jsonb_build_object(text, text) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('jsonb_build_object'); return pg_catalog.jsonb_build_object($1, $2); end $f$;
create function public.jsonb_build_object(text, jsonb) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('jsonb_build_object'); return pg_catalog.jsonb_build_object($1, $2); end $f$;
create function public.unnest(text[]) returns setof text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('unnest(text[])'); return query select pg_catalog.unnest($1); end $f$;
create function public.unnest(bigint[]) returns setof bigint language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('unnest(bigint[])'); return query select pg_catalog.unnest($1); end $f$;
create function public.generate_series(integer, integer) returns setof integer language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('generate_series'); return query select pg_catalog.generate_series($1, $2); end $f$;
create function public.generate_series(bigint, bigint) returns setof bigint language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('generate_series'); return query select pg_catalog.generate_series($1, $2); end $f$;
create function public.cardinality(text[]) returns integer language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('cardinality'); return pg_catalog.cardinality($1); end $f$;

-- More specific than to_jsonb(anyelement): these win wherever public is in the path.
create function public.to_jsonb(text) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(text)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(jsonb) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(jsonb)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(bigint) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(bigint)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(integer) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(integer)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(uuid) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(uuid)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(timestamptz) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(timestamptz)'); return pg_catalog.to_jsonb($1); end $f$;
create function public.to_jsonb(boolean) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('to_jsonb(boolean)'); return pg_catalog.to_jsonb($1); end $f$;

-- Aggregates: count(*) and the specific count(T) beat count("any").
create function public.shadow_count(bigint) returns bigint language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('count'); return $1 + 1; end $f$;
create function public.shadow_count_x(bigint, anyelement) returns bigint language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('count(x)'); return $1 + 1; end $f$;
create aggregate public.count(*) (sfunc = public.shadow_count, stype = bigint, initcond = '0');
create aggregate public.count(text) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create aggregate public.count(uuid) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create aggregate public.count(bigint) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create aggregate public.count(integer) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create function public.shadow_string_agg(text, text, text) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('string_agg'); return pg_catalog.concat_ws($3, $1, $2); end $f$;
create aggregate public.string_agg(text, text) (sfunc = public.shadow_string_agg, stype = text);
create function public.shadow_bool_and(boolean, boolean) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('bool_and'); return coalesce($1, true) and $2; end $f$;
create aggregate public.bool_and(boolean) (sfunc = public.shadow_bool_and, stype = boolean);
create aggregate public.bool_or(boolean) (sfunc = public.shadow_bool_and, stype = boolean);
create function public.shadow_pick(anyelement, anyelement) returns anyelement language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('min/max'); return coalesce($1, $2); end $f$;
create aggregate public.min(text) (sfunc = public.shadow_pick, stype = text);
create aggregate public.max(text) (sfunc = public.shadow_pick, stype = text);
create aggregate public.min(bigint) (sfunc = public.shadow_pick, stype = bigint);
create aggregate public.max(bigint) (sfunc = public.shadow_pick, stype = bigint);
create aggregate public.min(integer) (sfunc = public.shadow_pick, stype = integer);
create aggregate public.max(integer) (sfunc = public.shadow_pick, stype = integer);
create aggregate public.min(timestamptz) (sfunc = public.shadow_pick, stype = timestamptz);
create aggregate public.max(timestamptz) (sfunc = public.shadow_pick, stype = timestamptz);
create aggregate public.sum(bigint) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create aggregate public.sum(integer) (sfunc = public.shadow_count_x, stype = bigint, initcond = '0');
create function public.shadow_array_agg(text[], text) returns text[] language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('array_agg'); return pg_catalog.array_append($1, $2); end $f$;
create aggregate public.array_agg(text) (sfunc = public.shadow_array_agg, stype = text[]);
create function public.shadow_jsonb_agg(jsonb, jsonb) returns jsonb language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('jsonb_agg'); return coalesce($1, '[]'::pg_catalog.jsonb) || $2; end $f$;
create aggregate public.jsonb_agg(jsonb) (sfunc = public.shadow_jsonb_agg, stype = jsonb);

-- Operators.
create function public.shadow_eq_text(text, text) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('text = text'); return $1 operator(pg_catalog.=) $2; end $f$;
create operator public.= (leftarg = text, rightarg = text, function = public.shadow_eq_text);
create function public.shadow_eq_bigint(bigint, bigint) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('bigint = bigint'); return $1 operator(pg_catalog.=) $2; end $f$;
create operator public.= (leftarg = bigint, rightarg = bigint, function = public.shadow_eq_bigint);
create function public.shadow_eq_uuid(uuid, uuid) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('uuid = uuid'); return $1 operator(pg_catalog.=) $2; end $f$;
create operator public.= (leftarg = uuid, rightarg = uuid, function = public.shadow_eq_uuid);
create function public.shadow_concat(text, text) returns text language plpgsql set search_path = pg_catalog
as $f$ begin perform public.shadow_hit('text || text'); return $1 operator(pg_catalog.||) $2; end $f$;
create operator public.|| (leftarg = text, rightarg = text, function = public.shadow_concat);

-- Types named as built-ins: a cast ::text or ::jsonb runs the domain's check.
create function public.shadow_check(anyelement) returns boolean language plpgsql set search_path = pg_catalog
as $f$ begin return public.shadow_hit('cast to a shadow domain'); end $f$;
create domain public.text as pg_catalog.text check (public.shadow_check(value));
create domain public.jsonb as pg_catalog.jsonb check (public.shadow_check(value));
create domain public.uuid as pg_catalog.uuid check (public.shadow_check(value));
create domain public.timestamptz as pg_catalog.timestamptz check (public.shadow_check(value));
create domain public.int8 as pg_catalog.int8 check (public.shadow_check(value));
create domain public.name as pg_catalog.name check (public.shadow_check(value));

-- Catalog relations named as pg_catalog's: an unqualified pg_class reads these.
create view public.pg_class as select * from pg_catalog.pg_class where public.shadow_hit('pg_class');
create view public.pg_namespace as select * from pg_catalog.pg_namespace where public.shadow_hit('pg_namespace');
create view public.pg_proc as select * from pg_catalog.pg_proc where public.shadow_hit('pg_proc');
create view public.pg_attribute as select attrelid, attname, atttypid, attlen, attnum, atttypmod, attnotnull, atthasdef, atthasmissing, attidentity, attgenerated, attisdropped, attislocal, attinhcount, attcollation from pg_catalog.pg_attribute where public.shadow_hit('pg_attribute');
create view public.pg_constraint as select * from pg_catalog.pg_constraint where public.shadow_hit('pg_constraint');
create view public.pg_index as select * from pg_catalog.pg_index where public.shadow_hit('pg_index');
create view public.pg_type as select * from pg_catalog.pg_type where public.shadow_hit('pg_type');
create view public.pg_trigger as select * from pg_catalog.pg_trigger where public.shadow_hit('pg_trigger');
create view public.pg_extension as select * from pg_catalog.pg_extension where public.shadow_hit('pg_extension');
create view public.pg_depend as select * from pg_catalog.pg_depend where public.shadow_hit('pg_depend');
create view public.pg_roles as select * from pg_catalog.pg_roles where public.shadow_hit('pg_roles');
create view public.pg_settings as select * from pg_catalog.pg_settings where public.shadow_hit('pg_settings');
create view public.pg_locks as select * from pg_catalog.pg_locks where public.shadow_hit('pg_locks');
create view public.pg_stat_activity as select * from pg_catalog.pg_stat_activity where public.shadow_hit('pg_stat_activity');
create view public.pg_database as select * from pg_catalog.pg_database where public.shadow_hit('pg_database');
create view public.pg_stat_replication as select * from pg_catalog.pg_stat_replication where public.shadow_hit('pg_stat_replication');
`

// hostileSchema creates role evil, lets it create in schema public (as
// PostgreSQL before 15 let everyone), creates its shadows there, and turns
// on function call counting in db (counted even in a transaction that rolls
// back or is read-only, where the recorder cannot insert).
func hostileSchema(t *testing.T, db *testdb.DB) hostile {
	t.Helper()
	ctx := context.Background()
	evil := pgprovider.RandomName("h_evil")
	ident := pgx.Identifier{evil}.Sanitize()
	db.Exec(t, "create role "+ident+" nologin")
	t.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), "drop owned by "+ident+" cascade"); err != nil {
			t.Errorf("drop owned by %s: %v", evil, err)
		}
		dropRole(t, evil)
	})
	db.Exec(t,
		"grant create, usage on schema public to "+ident,
		"alter database "+pgx.Identifier{dbName(t, db)}.Sanitize()+" set track_functions = 'all'")
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "set local role "+ident+"; set local search_path = public, pg_catalog"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(shadowSQL, ident)); err != nil {
		t.Fatalf("creating the shadows: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The shadows work: a session (as evil, so its escalation fails) whose
	// path puts public first calls them, and the server counts the calls
	// once that session has ended.
	// Raw, unpinned on purpose: this session must find the shadows.
	check, err := session.Open(ctx, db.DSN, session.Raw)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	_, err = check.Exec(ctx, "set role "+ident+"; set search_path = public, pg_catalog")
	if err == nil {
		err = check.QueryRow(ctx, "select count(*) from (values ('a'::text)) v where v.column1 = 'a'").Scan(&n)
	}
	check.Close(ctx)
	if err != nil || n != 1 {
		t.Fatalf("the shadows do not work: count %d, %v", n, err)
	}
	var recorded int
	if err := db.Pool.QueryRow(ctx, "select pg_catalog.count(*) from public.shadow_calls").Scan(&recorded); err != nil || recorded < 2 {
		t.Fatalf("the shadows do not record: %d calls, %v", recorded, err)
	}
	db.Exec(t, "delete from public.shadow_calls")
	h := hostile{evil: evil}
	if !eventually(func() bool { h.baseline = shadowCallsCounted(t, db, evil); return h.baseline >= 2 }, 10*time.Second) {
		t.Fatal("the server does not count the shadows' calls (track_functions)")
	}
	return h
}

// hostile is the hostile role and the calls the server had counted once its
// shadows were checked.
type hostile struct {
	evil     string
	baseline int64
}

// shadowsCalled returns what the shadows recorded and how often the
// server counted a call to any function evil owns, once every session of
// the tool has ended (a backend writes its counts when it exits).
func shadowsCalled(t *testing.T, db *testdb.DB, evil string) (recorded []string, counted int64) {
	t.Helper()
	ctx := context.Background()
	if !eventually(func() bool { return toolSessions(t, db) == 0 }, 15*time.Second) {
		t.Fatal("the tool's sessions did not end")
	}
	rows, err := db.Pool.Query(ctx, `select pg_catalog.format('%s by %s (%s)', what, by_user, app) from public.shadow_calls`)
	if err != nil {
		t.Fatal(err)
	}
	recorded, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return recorded, shadowCallsCounted(t, db, evil)
}

// shadowCallsCounted is the server's count of calls to evil's functions.
func shadowCallsCounted(t *testing.T, db *testdb.DB, evil string) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var n int64
	if _, err := conn.Exec(ctx, `select pg_catalog.pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `
		select coalesce(pg_catalog.sum(s.calls), 0)::pg_catalog.int8
		from pg_catalog.pg_stat_user_functions s
		join pg_catalog.pg_proc p on p.oid = s.funcid
		where p.proowner = (select oid from pg_catalog.pg_roles where rolname = $1)`, evil).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// toolSessions counts the tool's sessions on db.
func toolSessions(t *testing.T, db *testdb.DB) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), `select pg_catalog.count(*)::int from pg_catalog.pg_stat_activity
		where datname = pg_catalog.current_database() and application_name like 'pgflow-upgrade%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rolesSnapshot is every role's attributes, to see that none changed.
func rolesSnapshot(t *testing.T, db *testdb.DB) string {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(context.Background(), `
		select pg_catalog.string_agg(pg_catalog.format('%s:%s%s%s%s%s', rolname, rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls), ',' order by rolname)
		from pg_catalog.pg_roles where rolname like 'h\_%' or rolname = current_user`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// foreignRefs lists the objects outside evil's own that depend on one of
// evil's (a column default, a check, an index expression, a function).
func foreignRefs(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		select pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> ' || pg_catalog.pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
		from pg_catalog.pg_depend d
		where d.refclassid in ('pg_catalog.pg_proc'::pg_catalog.regclass, 'pg_catalog.pg_type'::pg_catalog.regclass, 'pg_catalog.pg_operator'::pg_catalog.regclass, 'pg_catalog.pg_class'::pg_catalog.regclass)
		  and pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0) ~ '(^| )public\.'
		  and pg_catalog.pg_describe_object(d.classid, d.objid, 0) ~ '(^| )(pgflow|pgmq|pgflow_upgrade)[._]'`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hostilePaths are the two ways a connection gets the hostile search_path:
// the DSN's options (connecting as the server's superuser), and a role
// setting (a superuser role made for the test, so no shared role changes).
func hostilePaths(t *testing.T, db *testdb.DB) map[string]string {
	t.Helper()
	u, err := url.Parse(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", "-csearch_path=public,pg_catalog")
	u.RawQuery = q.Encode()
	viaOptions := u.String()

	admin := pgprovider.RandomName("h_admin")
	ident := pgx.Identifier{admin}.Sanitize()
	db.Exec(t, "create role "+ident+" login superuser", "alter role "+ident+" set search_path = public, pg_catalog")
	t.Cleanup(func() {
		// What the tool created as this role (the upgrade's objects) first.
		if _, err := db.Pool.Exec(context.Background(), "drop owned by "+ident+" cascade"); err != nil {
			t.Errorf("drop owned by %s: %v", admin, err)
		}
		dropRole(t, admin)
	})
	u, _ = url.Parse(db.DSN)
	u.User = url.UserPassword(admin, secretPassword)
	return map[string]string{"dsn options": viaOptions, "alter role set": u.String()}
}

// assertNoShadowCalled fails the test if any shadow ran, any role changed or
// anything of the tool's points at evil's objects.
func assertNoShadowCalled(t *testing.T, db *testdb.DB, h hostile, roles string) {
	t.Helper()
	recorded, counted := shadowsCalled(t, db, h.evil)
	if len(recorded) > 0 || counted > h.baseline {
		t.Errorf("the tool called %d shadow functions of a less-privileged role: %q", counted-h.baseline, recorded)
	}
	if now := rolesSnapshot(t, db); now != roles {
		t.Errorf("roles changed:\nbefore %s\nafter  %s", roles, now)
	}
	if refs := foreignRefs(t, db); len(refs) > 0 {
		t.Errorf("objects of the tool or of pgflow depend on the hostile role's objects:\n%s", strings.Join(refs, "\n"))
	}
}

// TestHostileSearchPathShadows runs every command against a database where a
// less-privileged role shadows the built-ins, with the connection's
// search_path putting that role's schema first: no shadow runs.
func TestHostileSearchPathShadows(t *testing.T) {
	testdb.SkipIfShort(t, "runs every command against a database where a less-privileged role shadows the built-ins, with the...")
	for _, mode := range []string{"dsn options", "alter role set"} {
		t.Run(mode, func(t *testing.T) {
			t.Run("apply", func(t *testing.T) {
				db := clitest.LegacyDB(t)
				h := hostileSchema(t, db)
				dsnValue := hostilePaths(t, db)[mode]
				roles := rolesSnapshot(t, db)
				out := filepath.Join(t.TempDir(), "capture.gz")
				for _, args := range [][]string{
					{"audit"}, {"status"},
					{"fixtures", "capture", "--out", out},
					{"apply", "--dry-run", "--yes"},
					{"apply", "--yes"}, {"verify"}, {"status"}, {"audit"}, {"apply", "--yes"},
				} {
					r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
					t.Logf("%v: exit %d: %s", args, r.Code, firstLine(r.Stdout+r.Stderr))
					if r.Code != cli.ExitOK {
						t.Errorf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
					}
				}
				assertNoShadowCalled(t, db, h, roles)
				// The capture replays (its throwaway databases are the tool's own).
				r := clitest.Run(t, map[string]string{"PGFLOW_UPGRADE_NO_DOCKER": "1"}, "--dsn", serverDSNOf(t, dsnValue), "fixtures", "replay", "--from", out, "--parallel", "1")
				t.Logf("replay --from: exit %d: %s", r.Code, lastLine(r.Stdout))
				if r.Code != cli.ExitOK {
					t.Errorf("replay --from: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
				}
			})
			t.Run("apply --online and rollback", func(t *testing.T) {
				db := clitest.LegacyDB(t)
				h := hostileSchema(t, db)
				dsnValue := hostilePaths(t, db)[mode]
				roles := rolesSnapshot(t, db)
				// Stopped in the middle (by the test's own session), then the
				// commands an operator runs on an interrupted online upgrade.
				stopOnlineAt(t, db, online.PointBatch)
				for _, args := range [][]string{
					{"status"}, {"audit"}, {"apply", "--rollback-online", "--yes"}, {"status"},
					{"apply", "--online", "--yes"}, {"verify"}, {"status"},
				} {
					r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
					t.Logf("%v: exit %d: %s", args, r.Code, firstLine(r.Stdout+r.Stderr))
					if r.Code != cli.ExitOK && !(args[0] == "audit" && r.Code == cli.ExitFindings) {
						t.Errorf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
					}
				}
				assertNoShadowCalled(t, db, h, roles)
			})
			t.Run("fixtures load", func(t *testing.T) {
				db := testdb.Empty(t)
				h := hostileSchema(t, db)
				dsnValue := hostilePaths(t, db)[mode]
				roles := rolesSnapshot(t, db)
				for _, args := range [][]string{{"fixtures", "load", "inflight"}, {"audit"}} {
					r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
					t.Logf("%v: exit %d: %s", args, r.Code, firstLine(r.Stdout+r.Stderr))
					if r.Code != cli.ExitOK {
						t.Errorf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
					}
				}
				assertNoShadowCalled(t, db, h, roles)
			})
		})
	}
}

// serverDSNOf is dsnValue pointed at the maintenance database, for replay.
func serverDSNOf(t *testing.T, dsnValue string) string {
	u, err := url.Parse(dsnValue)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	return u.String()
}

func firstLine(s string) string { return strings.SplitN(strings.TrimSpace(s), "\n", 2)[0] }

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestSessionSearchPathPinned: the pin of a session.Tool session wins over the DSN's options, a role
// setting and a search_path in the DSN itself, and every transaction starts
// with the pinned path even after a session-level SET on the connection.
func TestSessionSearchPathPinned(t *testing.T) {
	db := testdb.Empty(t)
	ctx := context.Background()
	paths := hostilePaths(t, db)
	for name, raw := range map[string]string{
		"dsn options":        paths["dsn options"],
		"alter role set":     paths["alter role set"],
		"search_path in dsn": db.DSN + "&search_path=public",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := session.OpenWith(ctx, raw, session.Options{Purpose: session.Tool, Name: "test"})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			show := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}) string {
				var p string
				if err := q.QueryRow(ctx, "select pg_catalog.current_setting('search_path')").Scan(&p); err != nil {
					t.Fatal(err)
				}
				return p
			}
			if p := show(conn); p != session.SearchPath {
				t.Errorf("session search_path %q, want %q", p, session.SearchPath)
			}
			if _, err := conn.Exec(ctx, "set search_path = public, pg_catalog"); err != nil {
				t.Fatal(err)
			}
			for _, opts := range []pgx.TxOptions{{}, {AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}} {
				tx, err := conn.BeginTx(ctx, opts)
				if err != nil {
					t.Fatal(err)
				}
				if p := show(tx); p != session.SearchPath {
					t.Errorf("transaction %+v: search_path %q, want %q", opts, p, session.SearchPath)
				}
				if err := tx.Rollback(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestHostileSearchPathThroughPooler: through PgBouncer in transaction mode,
// which refuses a search_path startup parameter (session.Connect then pins per transaction), with
// the hostile path set on the database (ALTER DATABASE ... SET): the
// commands call no shadow either.
func TestHostileSearchPathThroughPooler(t *testing.T) {
	b := pooled(t)
	db := clitest.LegacyDB(t)
	h := hostileSchema(t, db)
	db.Exec(t, "alter database "+pgx.Identifier{dbName(t, db)}.Sanitize()+" set search_path = public, pg_catalog")
	roles := rolesSnapshot(t, db)
	dsnValue := viaBouncer(t, b, db, "simple_protocol")
	for _, args := range [][]string{{"audit"}, {"status"}, {"apply", "--yes"}, {"verify"}, {"status"}, {"audit"}} {
		r := clitest.Run(t, nil, append([]string{"--dsn", dsnValue}, args...)...)
		t.Logf("%v: exit %d: %s", args, r.Code, firstLine(r.Stdout+r.Stderr))
		if r.Code != cli.ExitOK {
			t.Errorf("%v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
		}
	}
	// PgBouncer keeps its server connections: they end when the bouncer does.
	b.Close()
	assertNoShadowCalled(t, db, h, roles)
}
