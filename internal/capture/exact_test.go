package capture_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture/capturetest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// aclSQL lists the grants of the schemas pgflow and app, owners aside.
const aclSQL = `select pg_catalog.string_agg(x, E'\n' order by x) from (
	select c.relname || ':' || coalesce(pg_catalog.array_to_string(c.relacl, ','), '') || ':' ||
		coalesce((select pg_catalog.string_agg(a.attname || '=' || pg_catalog.array_to_string(a.attacl, ','), ',' order by a.attnum) from pg_catalog.pg_attribute a where a.attrelid = c.oid and a.attacl is not null), '') as x
	from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace where n.nspname in ('pgflow', 'app')
	union all select p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || '):' || coalesce(pg_catalog.array_to_string(p.proacl, ','), '')
	from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace where n.nspname in ('pgflow', 'app')
	union all select n.nspname || ':' || coalesce(pg_catalog.array_to_string(n.nspacl, ','), '') from pg_catalog.pg_namespace n where n.nspname in ('pgflow', 'app')
	union all select 'policy ' || polname || ':' || pg_catalog.pg_get_expr(polqual, polrelid) from pg_catalog.pg_policy
	union all select 'comment ' || d.description from pg_catalog.pg_description d join pg_catalog.pg_class c on c.oid = d.objoid join pg_catalog.pg_namespace n on n.oid = c.relnamespace where n.nspname in ('pgflow', 'app')
	union all select 'rls ' || relname || relrowsecurity from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace where n.nspname = 'app'
	union all select 'seq ' || sequencename || ' ' || coalesce(last_value::text, '-') from pg_catalog.pg_sequences where schemaname in ('app', 'pgflow', 'pgmq')
) s`

// ownerless replaces the source's owner role in an ACL text by X: the
// replaying role owns the rebuilt objects.
func ownerless(s, owner string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, owner+"=", "X="), "/"+owner, "/X")
}

func TestCaptureRebuildsExactly(t *testing.T) {
	ctx := context.Background()
	capturetest.DropRole(t, "w19r_capture_reader")
	src := testdb.Empty(t)
	capturetest.LoadInflight(t, src)
	if _, err := scenario.Generate(ctx, src.Pool, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Pool.Exec(ctx, capturetest.CustomizeSQL); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	conn := testdb.Connect(t, src.DSN)
	defer conn.Close(ctx)
	if _, err := capture.Write(ctx, conn, &file, capture.Options{IncludeSchemas: []string{"app"}}); err != nil {
		t.Fatal(err)
	}
	c, err := capture.Read(bytes.NewReader(file.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	h := c.Header
	if h.Version != 2 || h.PgflowVersion != "0.16.0" || h.PGMQ == "" || len(h.Schemas) != 2 || h.Rows("pgflow.step_tasks") <= 0 || h.Rows("app.jobs") <= 0 {
		t.Fatalf("header: %+v", h)
	}
	if len(h.Extensions) != 1 || h.Extensions[0] != (capture.Extension{Name: "citext", Schema: "extensions"}) {
		t.Fatalf("extensions %+v, want citext in extensions", h.Extensions)
	}
	if strings.Join(h.Roles, ",") != "w19r_capture_reader" {
		t.Fatalf("roles %v, want the reader only", h.Roles)
	}

	dst := restored(t, c)
	sameCatalogs(t, src, dst, "pgflow", "app")
	if d, _ := rowDiff(t, src, dst); len(d) > 0 {
		t.Errorf("rebuilt rows differ:\n%s", fingerprint.Format(d, 20))
	}
	var srcOwner, dstOwner, srcACL, dstACL, srcJobs, dstJobs string
	for _, x := range []struct {
		db         *testdb.DB
		owner, acl *string
		jobs       *string
	}{{src, &srcOwner, &srcACL, &srcJobs}, {dst, &dstOwner, &dstACL, &dstJobs}} {
		if err := x.db.Pool.QueryRow(ctx, `select pg_catalog.pg_get_userbyid(relowner)::text from pg_catalog.pg_class where oid = 'pgflow.runs'::regclass`).Scan(x.owner); err != nil {
			t.Fatal(err)
		}
		if err := x.db.Pool.QueryRow(ctx, aclSQL).Scan(x.acl); err != nil {
			t.Fatal(err)
		}
		if err := x.db.Pool.QueryRow(ctx, `select pg_catalog.string_agg(j::text, ';' order by id) from app.jobs j`).Scan(x.jobs); err != nil {
			t.Fatal(err)
		}
	}
	if ownerless(srcACL, srcOwner) != ownerless(dstACL, dstOwner) {
		t.Errorf("grants, policies, comments or sequences differ:\nsource:\n%s\nrebuilt:\n%s", srcACL, dstACL)
	}
	if srcJobs == "" || srcJobs != dstJobs {
		t.Errorf("app.jobs rows: source %q, rebuilt %q", srcJobs, dstJobs)
	}
	// The rebuilt identity continues where the source's stood.
	var next int64
	if err := dst.Pool.QueryRow(ctx, `insert into app.jobs (flow_slug) select flow_slug from pgflow.flows limit 1 returning ticket`).Scan(&next); err != nil {
		t.Fatal(err)
	}
	if next != 501 {
		t.Errorf("app.ticket_seq continued at %d, want 501", next)
	}
}

// A version 1 file (rows only, written before the rehearsal) is still read
// and restored into the project's own 0.16.0 baseline.
func TestCaptureVersion1StillRestores(t *testing.T) {
	ctx := context.Background()
	file := gzipped(`{"format": "pgflow-upgrade-capture", "version": 1, "pgflow_state": "baseline", "created_at": "2026-12-02T12:00:00Z"}
{"table": "pgflow.flows", "row": {"flow_slug": "old_file", "opt_max_attempts": 3, "opt_base_delay": 1, "opt_timeout": 60, "created_at": "2026-12-01T00:00:00Z"}}
{"table": "pgmq.queue", "row": {"queue_name": "old_file", "is_partitioned": false, "is_unlogged": false, "created_at": "2026-12-01T00:00:00Z"}}
{"table": "pgmq.q", "queue": "old_file", "row": {"msg_id": 7, "read_ct": 0, "enqueued_at": "2026-12-01T00:00:00Z", "vt": "2026-12-01T00:00:00Z", "message": {"k": 1}, "headers": null}}
{"end": {"records": 3}}
`)
	c, err := capture.Read(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	dst := restored(t, c)
	var flows, next int64
	if err := dst.Pool.QueryRow(ctx, `select (select count(*) from pgflow.flows where flow_slug = 'old_file'), (select * from pgmq.send('old_file', '{}'))`).Scan(&flows, &next); err != nil {
		t.Fatal(err)
	}
	if flows != 1 || next != 8 {
		t.Fatalf("restored version 1 file: %d flows, next message id %d (want 1, 8)", flows, next)
	}
}

func TestCaptureRefusesPartitionedTables(t *testing.T) {
	ctx := context.Background()
	src := testdb.Baseline(t)
	if _, err := src.Pool.Exec(ctx, `create schema app; create table app.p (id int) partition by range (id)`); err != nil {
		t.Fatal(err)
	}
	conn := testdb.Connect(t, src.DSN)
	defer conn.Close(ctx)
	var file bytes.Buffer
	_, err := capture.Write(ctx, conn, &file, capture.Options{IncludeSchemas: []string{"app"}})
	if err == nil || !strings.Contains(err.Error(), "app.p") {
		t.Fatalf("capture of a partitioned table: %v", err)
	}
	if _, err := capture.Write(ctx, conn, &file, capture.Options{IncludeSchemas: []string{"pgmq"}}); err == nil {
		t.Fatal("--include-schema pgmq accepted")
	}
}
