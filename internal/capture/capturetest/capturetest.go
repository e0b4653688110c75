// Package capturetest holds what the tests of the capture file and of the
// rehearsal share: a pgflow 0.16.0 database with the additions its owners
// make (CustomizeSQL over LoadInflight's state) and the role it creates
// (DropRole).
package capturetest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// CustomizeSQL is what owners add to a pgflow 0.16.0 database: their own
// index, constraint, grants (table, column, function, a revoked PUBLIC
// execute), a comment, and a second schema whose table references
// pgflow.flows, with an identity column, a generated column, a view over
// pgflow.runs, a function, a trigger, a domain, an enum, a sequence and row
// security.
const CustomizeSQL = `
	create role w19r_capture_reader nologin;
	create index w19r_runs_by_status on pgflow.runs (status, started_at desc);
	alter table pgflow.flows add constraint w19r_flows_slug_short check (pg_catalog.length(flow_slug) < 200);
	grant select on pgflow.runs to w19r_capture_reader;
	grant select (flow_slug) on pgflow.flows to w19r_capture_reader;
	grant usage on schema pgflow to w19r_capture_reader;
	revoke execute on function pgflow.is_valid_slug(text) from public;
	grant execute on function pgflow.is_valid_slug(text) to w19r_capture_reader;
	comment on index pgflow.w19r_runs_by_status is 'ours';
	create schema app;
	create schema extensions;
	create extension citext with schema extensions;
	create type app.priority as enum ('low', 'high');
	create domain app.positive as integer check (value > 0);
	create sequence app.ticket_seq start with 100;
	create table app.jobs (
		id bigint generated always as identity,
		flow_slug text not null references pgflow.flows (flow_slug),
		priority app.priority not null default 'low',
		weight app.positive,
		ticket bigint default pg_catalog.nextval('app.ticket_seq'),
		label text generated always as (flow_slug || '!') stored,
		tag extensions.citext default 'Mixed',
		primary key (id));
	create unique index jobs_ticket on app.jobs (ticket);
	create view app.open_runs as select run_id, flow_slug from pgflow.runs where status = 'started';
	create function app.touch() returns trigger language plpgsql set search_path = '' as $$ begin return new; end $$;
	create trigger jobs_touch before update on app.jobs for each row execute function app.touch();
	alter table app.jobs enable row level security;
	create policy jobs_read on app.jobs for select to w19r_capture_reader using (priority = 'high');
	grant select on app.jobs to w19r_capture_reader;
	comment on table app.jobs is 'jobs of ours';
	comment on column app.jobs.weight is 'how heavy';
	insert into app.jobs (flow_slug, priority, weight) select flow_slug, 'high', 3 from pgflow.flows;
	select pg_catalog.setval('app.ticket_seq', 500);
`

// DropRole drops role now and once the test's databases are gone (the
// cleanup registered first runs last): a role is the server's.
func DropRole(t testing.TB, role string) {
	t.Helper()
	drop := func() error {
		conn, err := session.Open(context.Background(), testdb.Server(t).DSNFor("postgres"), session.Admin)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "drop role if exists "+pgx.Identifier{role}.Sanitize())
		return err
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("dropping role %s: %v", role, err)
		}
	})
}

// LoadInflight loads fixtures' inflight state (the real 0.16.0 engine).
func LoadInflight(t testing.TB, db *testdb.DB) {
	t.Helper()
	st, err := fixtures.Lookup("inflight")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Load(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
}
