package upgrade_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgflowfiles"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// upstreamInflight is a database built from upstream's files at release,
// with the fixtures' in-flight runs, tasks and messages.
func upstreamInflight(t *testing.T, release string) *testdb.DB {
	t.Helper()
	t.Logf("components: %s", testdb.UpstreamComponents())
	db := testdb.Upstream(t, release)
	if err := fixtures.LoadInflightRuns(context.Background(), db.Pool); err != nil {
		t.Fatal(err)
	}
	return db
}

// sameCatalogs fails unless db's schemas pgflow and pgflow_telemetry are
// those of a database built from upstream's own files at release.
func sameCatalogs(t *testing.T, db *testdb.DB, release string, sources bool) {
	t.Helper()
	ctx := context.Background()
	want := testdb.Upstream(t, release)
	for _, schema := range []string{"pgflow", "pgflow_telemetry"} {
		w, err := catalog.Read(ctx, want.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		g, err := catalog.Read(ctx, db.Pool, schema)
		if err != nil {
			t.Fatal(err)
		}
		if d := catalog.Diff(w, g); len(d) != 0 {
			t.Fatalf("schema %s differs from upstream's %s:\n%s", schema, release, strings.Join(catalog.Strings(d), "\n"))
		}
	}
	if !sources {
		return
	}
	// Function bodies too, when no hop was this tool's own (whose
	// functions behave as upstream's without being its text): the catalog
	// compares attributes, not sources.
	bodies := func(db *testdb.DB) string {
		var s string
		if err := db.Pool.QueryRow(ctx, `select string_agg(p.oid::regprocedure::text || ' ' || md5(p.prosrc), E'\n' order by p.oid::regprocedure::text)
			from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
			where n.nspname in ('pgflow', 'pgflow_telemetry')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if g, w := bodies(db), bodies(want); g != w {
		t.Fatalf("function sources differ from upstream's %s:\n got %s\nwant %s", release, g, w)
	}
}

// ledgerNames is the Supabase ledger, version_name in order.
func ledgerNames(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `select version || '_' || name from supabase_migrations.schema_migrations order by version, name`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hopApply upgrades db with upstream's files from an installed copy and
// checks what every plan must give: the release reached, every row and
// message as upstream's own files leave them (run in order on a copy of
// db), the catalog upstream's.
func hopApply(t *testing.T, db *testdb.DB, opts upgrade.Options, reached string) *upgrade.Report {
	t.Helper()
	ctx := testCtx(t)
	// The reference: the same database taken to the same release by
	// upstream's own files, run as `supabase db push` runs them.
	var from int
	if err := db.Pool.QueryRow(ctx, `select count(*)::int from supabase_migrations.schema_migrations`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	theirs := db.Clone(t)
	res, err := upgrade.Apply(ctx, testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	rep := res.Report
	if rep.VersionNow != reached || rep.Plan == nil || rep.Plan.Reached != reached {
		t.Fatalf("reached %q (plan %+v), want %s", rep.VersionNow, rep.Plan, reached)
	}
	for _, pc := range rep.PostConditions {
		if !pc.OK {
			t.Errorf("post-condition %s failed: %s", pc.ID, pc.Detail)
		}
	}
	rel, err := versions.LookupRelease(reached)
	if err != nil {
		t.Fatal(err)
	}
	theirs.PushUpstream(t, from, rel.Files)
	want := theirs.Fingerprint(t)
	got := db.Fingerprint(t)
	if d := append(fingerprint.Compare(want, got), fingerprint.Added(want, got)...); len(d) != 0 || got.RowCount() != want.RowCount() {
		t.Fatalf("rows or messages differ from upstream's own files run in order (%d rows, upstream's %d):\n%s",
			got.RowCount(), want.RowCount(), fingerprint.Format(d, 20))
	}
	sameCatalogs(t, db, reached, !rep.Plan.Has(upgrade.HopOwn))
	// The blocking statements were built beforehand, the online way: 0.17.1's
	// three indexes CONCURRENTLY, file 22's CHECK NOT VALID then validated.
	wantBuilt := 0
	for _, h := range rep.Plan.Hops {
		switch h.Upstream.Index {
		case 22:
			wantBuilt++
		case 26:
			wantBuilt += 3
		}
	}
	done := 0
	for _, s := range rep.Statements {
		if strings.HasPrefix(s.Summary, "already built beforehand: ") {
			done++
		}
	}
	if done != wantBuilt {
		t.Errorf("%d statements found built beforehand, want %d", done, wantBuilt)
	}
	return rep
}

// From upstream's own 0.17.0 with work in flight to the newest release
// with upstream's files from a copy `pgflow install` renamed: the newest
// catalog exactly, every row and message kept, each file in the ledger
// under the copy's name, the telemetry job scheduled (upstream's default,
// said in the report).
func TestApplyHopsFrom0170ToNewest(t *testing.T) {
	db := upstreamInflight(t, "0.17.0")
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	rep := hopApply(t, db, opts, versions.Newest)
	if len(rep.Plan.Hops) != 3 || rep.Plan.Hops[0].Kind != upgrade.HopUpstream || len(rep.HopsApplied) != 3 {
		t.Fatalf("plan %+v, applied %v", rep.Plan.Hops, rep.HopsApplied)
	}
	ledger := ledgerNames(t, db)
	if len(ledger) != 27 {
		t.Fatalf("ledger has %d rows:\n%s", len(ledger), strings.Join(ledger, "\n"))
	}
	for i, f := range versions.UpstreamFiles()[24:] {
		want := strings.TrimSuffix(testdb.InstalledName(24+i, f.Name), ".sql")
		if ledger[len(ledger)-3+i] != want {
			t.Errorf("ledger row %d = %s, want the copy's %s", 25+i, ledger[len(ledger)-3+i], want)
		}
	}
	if n := scalarOf[int](t, db, `select count(*)::int from cron.job where jobname = 'pgflow_telemetry_report'`); n != 1 ||
		!strings.Contains(rep.Plan.Telemetry, "upstream's default") {
		t.Fatalf("telemetry job %d, plan says %q", n, rep.Plan.Telemetry)
	}
}

// --telemetry=off leaves no telemetry job: upstream's own disable() ran in
// the transaction.
func TestApplyHopsTelemetryOff(t *testing.T) {
	db := testdb.Upstream(t, "0.17.0")
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	opts.TelemetryOff = true
	res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied || !strings.Contains(res.Report.Telemetry, "telemetry off") {
		t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	if n := scalarOf[int](t, db, `select count(*)::int from cron.job where jobname = 'pgflow_telemetry_report'`); n != 0 {
		t.Fatalf("%d telemetry jobs left", n)
	}
}

// A copy that lacks a file the plan needs, or holds it altered, is refused
// naming the file and its hash, and nothing changes.
func TestApplyHopsRefusesMissingOrAlteredFile(t *testing.T) {
	f := versions.UpstreamFiles()[25]
	for _, c := range []struct {
		name  string
		spoil func(path string) error
		want  error
	}{
		{"missing", os.Remove, pgflowfiles.ErrMissing},
		{"altered", func(p string) error { return os.WriteFile(p, []byte("select 1;\n"), 0o600) }, pgflowfiles.ErrAltered},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := testdb.Upstream(t, "0.17.0")
			dir := testdb.PgflowInstalledCopy(t, 27)
			if err := c.spoil(filepath.Join(dir, testdb.InstalledName(25, f.Name))); err != nil {
				t.Fatal(err)
			}
			before := testdb.State(t, db.Pool)
			opts := fastOpts()
			opts.PgflowMigrations = dir
			res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
			if !errors.Is(err, c.want) || res.Outcome != outcome.Refused ||
				!strings.Contains(err.Error(), f.Name) || !strings.Contains(err.Error(), "h1:"+f.Hash) {
				t.Fatalf("got %v (%s)", err, res.Outcome)
			}
			testdb.SameState(t, before, testdb.State(t, db.Pool), "a refused apply")
		})
	}
}

// Without upstream's files the plan ends where this tool's own hop ends,
// and the report says what the rest needs; --to 0.17.0 is today's apply.
func TestApplyHopsWithoutFilesAndTo0170(t *testing.T) {
	t.Run("no files", func(t *testing.T) {
		db := testdb.Upstream(t, "0.16.0")
		res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), fastOpts())
		if err != nil || res.Outcome != outcome.Applied || res.Report.VersionNow != "0.17.0" ||
			!strings.Contains(res.Message, "needs upstream's files 25-27") || !strings.Contains(res.Message, "--pgflow-migrations") {
			t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
		}
	})
	t.Run("to 0.17.0", func(t *testing.T) {
		db := upstreamInflight(t, "0.16.0")
		opts := fastOpts()
		opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
		opts.To = "0.17.0"
		rep := hopApply(t, db, opts, "0.17.0")
		if len(rep.Plan.Hops) != 1 || rep.Plan.Hops[0].Kind != upgrade.HopOwn || rep.Plan.Rest != "" {
			t.Fatalf("plan %+v", rep.Plan)
		}
		ledger := ledgerNames(t, db)
		if want := strings.TrimSuffix(testdb.InstalledName(23, versions.UpstreamFiles()[23].Name), ".sql"); len(ledger) != 24 || ledger[23] != want {
			t.Fatalf("ledger (%d rows) ends %q, want the copy's %s", len(ledger), ledger[len(ledger)-1], want)
		}
	})
}

// From every release users sit at, with work in flight, to the newest:
// the newest catalog exactly, every row and message kept, the ledger
// holding all 27 files.
func TestLongApplyHopsFromEveryRelease(t *testing.T) {
	testdb.SkipUnlessLong(t, "apply from upstream's 0.14.1, 0.16.0, 0.17.0 and 0.17.1 (work in flight) ends at the newest release")
	for _, from := range []string{"0.14.1", "0.16.0", "0.17.0", "0.17.1"} {
		t.Run(from, func(t *testing.T) {
			db := upstreamInflight(t, from)
			opts := fastOpts()
			opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
			rep := hopApply(t, db, opts, versions.Newest)
			r, _ := versions.LookupRelease(from)
			if len(rep.Plan.Hops) != 27-r.Files {
				t.Fatalf("plan from %s has %d hops", from, len(rep.Plan.Hops))
			}
			if ledger := ledgerNames(t, db); len(ledger) != 27 {
				t.Fatalf("ledger has %d rows:\n%s", len(ledger), strings.Join(ledger, "\n"))
			}
		})
	}
}

// A run that fails after building beforehand, or a dry run, removes what it
// built: the database is exactly at its starting release.
func TestApplyHopsRemovesPrebuiltOnFailure(t *testing.T) {
	for _, dry := range []bool{false, true} {
		t.Run(map[bool]string{false: "failure", true: "dry run"}[dry], func(t *testing.T) {
			db := testdb.Upstream(t, "0.14.1")
			before := testdb.State(t, db.Pool)
			opts := fastOpts()
			opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
			opts.DryRun = dry
			if !dry {
				opts.Hooks.BeforeStep = func(_ context.Context, _ uint32, step string) error {
					if step == upgrade.StepPostChecks {
						return errors.New("injected failure")
					}
					return nil
				}
			}
			res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
			if dry != (err == nil) {
				t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
			}
			built := 0
			for _, s := range res.Report.Steps {
				if s.Step == upgrade.StepPrebuild {
					built++
				}
			}
			if built != 5 { // 3 indexes; the CHECK added, then validated
				t.Fatalf("%d prebuild steps: %+v", built, res.Report.Steps)
			}
			testdb.SameState(t, before, testdb.State(t, db.Pool), "after a failed or dry run")
		})
	}
}

// On a database already at upstream's newest, --telemetry off still opts
// out (a plan of no hops), and without it apply has nothing to do.
func TestApplyTelemetryOffAtNewest(t *testing.T) {
	db := testdb.Upstream(t, versions.Newest)
	res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), fastOpts())
	if err != nil || res.Outcome != outcome.AlreadyApplied || !strings.Contains(res.Message, "nothing to do") {
		t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	opts := fastOpts()
	opts.TelemetryOff = true
	res, err = upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied {
		t.Fatalf("apply --telemetry off: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	if n := scalarOf[int](t, db, `select count(*)::int from cron.job where jobname = 'pgflow_telemetry_report'`); n != 0 {
		t.Fatalf("%d telemetry jobs left", n)
	}
}

// apply --quiesce pauses 0.17.1's telemetry job with pgflow's other jobs
// while it upgrades, and restores it exactly.
func TestApplyHopsQuiescePausesTelemetryJob(t *testing.T) {
	db := testdb.Upstream(t, "0.17.1")
	active := func() bool {
		return scalarOf[bool](t, db, `select active from cron.job where jobname = 'pgflow_telemetry_report'`)
	}
	if !active() {
		t.Fatal("upstream's 0.17.1 left the telemetry job inactive")
	}
	var sawPaused bool
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	opts.Quiesce = &quiesce.Options{DrainTimeout: 10 * time.Second, Poll: 50 * time.Millisecond, Hooks: quiesce.Hooks{
		At: func(_ context.Context, point string) error {
			if point == quiesce.PointPaused {
				sawPaused = true
				if active() {
					t.Errorf("while paused: the telemetry job is active")
				}
			}
			return nil
		}}}
	res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied || !sawPaused {
		t.Fatalf("apply --quiesce: %v (%s: %s), paused seen %v", err, res.Outcome, res.Message, sawPaused)
	}
	if !active() {
		t.Fatal("the telemetry job was not restored")
	}
}

// File 22 repairs historical rows under the locks: tasks still queued or
// started of skipped steps become skipped, of failed runs cancelled. apply
// runs each repair as one statement per active status (through upstream's
// partial indexes, not a scan of step_tasks); the rows end exactly as
// upstream's own files leave them, and the repairs did change rows.
func TestApplyHopsRepairsActiveTasksAsUpstream(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	db := testdb.Upstream(t, "0.14.1")
	testdb.Exec(t, db.Pool, `select pgflow.create_flow('repair'); select pgflow.add_step('repair', 'a'); select pgflow.add_step('repair', 'b')`)
	testdb.Exec(t, db.Pool, `
		insert into pgflow.runs (run_id, flow_slug, status, input, remaining_steps, failed_at)
		values ('00000000-0000-0000-0000-00000000000a', 'repair', 'started', '{}', 2, null),
		       ('00000000-0000-0000-0000-00000000000b', 'repair', 'failed', '{}', 2, now());
		insert into pgflow.step_states (flow_slug, run_id, step_slug, status, remaining_tasks, skip_reason, skipped_at, started_at, initial_tasks)
		select 'repair', r, s, case when r::text like '%a' then 'skipped' else 'started' end,
		       case when r::text like '%a' then null else 1 end,
		       case when r::text like '%a' then 'condition_unmet' end,
		       case when r::text like '%a' then now() end, now(), 1
		  from unnest(array['00000000-0000-0000-0000-00000000000a', '00000000-0000-0000-0000-00000000000b']::uuid[]) r,
		       unnest(array['a', 'b']) s;
		insert into pgflow.step_tasks (flow_slug, run_id, step_slug, message_id, status, started_at)
		select 'repair', ss.run_id, ss.step_slug, row_number() over (), case when ss.step_slug = 'a' then 'queued' else 'started' end,
		       case when ss.step_slug = 'b' then now() end
		  from pgflow.step_states ss where ss.flow_slug = 'repair'`)
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	rep := hopApply(t, db, opts, versions.Newest)
	var split int
	var rows int64
	for _, s := range rep.Statements {
		if strings.HasPrefix(s.Summary, "one statement per active status") {
			split++
			rows += s.Rows
		}
	}
	if split != 2 || rows != 4 {
		t.Fatalf("file 22's repairs: %d split statements changing %d rows, want 2 changing 4 (a queued and a started task each)", split, rows)
	}
}

// An index an earlier run built beforehand and then left behind (killed,
// or the server went away, before its transaction committed) is found done
// when it is the one upstream's statement builds, and built again when the
// interrupted build left it invalid: the rerun ends at the newest release,
// its catalog upstream's.
func TestApplyHopsAdoptsIndexLeftByAStoppedRun(t *testing.T) {
	want := testdb.Upstream(t, versions.Newest)
	wantCat, err := catalog.Read(testCtx(t), want.Pool, versions.Schema)
	if err != nil {
		t.Fatal(err)
	}
	for _, invalid := range []bool{false, true} {
		t.Run(map[bool]string{false: "valid", true: "invalid"}[invalid], func(t *testing.T) {
			db := testdb.Upstream(t, "0.17.0")
			db.Exec(t, `create index concurrently "idx_runs_started_at" on "pgflow"."runs" ("started_at")`)
			if invalid {
				// What a CONCURRENTLY build interrupted before its end leaves.
				db.Exec(t, `update pg_catalog.pg_index set indisvalid = false where indexrelid = 'pgflow.idx_runs_started_at'::regclass`)
			}
			opts := fastOpts()
			opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
			res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
			if err != nil || res.Outcome != outcome.Applied || res.Report.VersionNow != versions.Newest {
				t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
			}
			got, err := catalog.Read(testCtx(t), db.Pool, versions.Schema)
			if err != nil {
				t.Fatal(err)
			}
			if d := catalog.Diff(wantCat, got); len(d) != 0 {
				t.Fatalf("catalog differs from upstream's newest:\n%s", strings.Join(catalog.Strings(d), "\n"))
			}
			if n := scalarOf[int](t, db, `select count(*)::int from pg_catalog.pg_index where indexrelid = 'pgflow.idx_runs_started_at'::regclass and indisvalid`); n != 1 {
				t.Fatalf("idx_runs_started_at valid: %d", n)
			}
		})
	}
}

// The CHECK an earlier run added beforehand and left behind (stopped
// before its commit) does not stop the rerun: it is dropped and built
// again, and the rerun ends at the newest release.
func TestApplyHopsDropsCheckLeftByAStoppedRun(t *testing.T) {
	db := testdb.Upstream(t, "0.14.1")
	db.Exec(t, `alter table "pgflow"."step_tasks" add constraint "pgflow_upgrade_valid_status"
		check (status = any (array['queued', 'started', 'completed', 'failed', 'skipped', 'cancelled'])) not valid`)
	opts := fastOpts()
	opts.PgflowMigrations = testdb.PgflowInstalledCopy(t, 27)
	res, err := upgrade.Apply(testCtx(t), testdb.Connect(t, db.DSN), opts)
	if err != nil || res.Outcome != outcome.Applied || res.Report.VersionNow != versions.Newest {
		t.Fatalf("apply: %v (%s: %s)", err, res.Outcome, res.Message)
	}
	if n := scalarOf[int](t, db, `select count(*)::int from pg_catalog.pg_constraint where conrelid = 'pgflow.step_tasks'::regclass
		and conname in ('pgflow_upgrade_valid_status', 'valid_status')`); n != 1 {
		t.Fatalf("%d of valid_status and pgflow_upgrade_valid_status on step_tasks, want valid_status alone", n)
	}
}
