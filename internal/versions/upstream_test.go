package versions_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// A database built from upstream's own files at each release has the
// release's catalog as the embedded facts describe it, and the Supabase
// ledger holds one row per file with its statements, as push writes it.
func TestUpstreamReleaseCatalogsAreTheFacts(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	for _, release := range []string{"0.14.1", "0.16.0", "0.17.0", "0.17.1"} {
		t.Run(release, func(t *testing.T) {
			db := testdb.Upstream(t, release)
			ctx := context.Background()
			got, err := catalog.Read(ctx, db.Pool, "pgflow")
			if err != nil {
				t.Fatal(err)
			}
			want, err := versions.Facts(release)
			if err != nil {
				t.Fatal(err)
			}
			if d := catalog.Diff(want, got); len(d) != 0 {
				t.Fatalf("upstream's %s differs from the embedded catalog:\n%s", release, strings.Join(catalog.Strings(d), "\n"))
			}
			files := testdb.UpstreamReleaseFiles(t, release)
			rows, err := db.Pool.Query(ctx, `select version || ' ' || name || ' ' || coalesce(cardinality(statements), 0)::text
			                                   from supabase_migrations.schema_migrations order by version`)
			if err != nil {
				t.Fatal(err)
			}
			ledger, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(ledger) != len(files) {
				t.Fatalf("ledger has %d rows, the release %d files:\n%s", len(ledger), len(files), strings.Join(ledger, "\n"))
			}
			for i, f := range files {
				fields := strings.Fields(ledger[i])
				if fields[0] != f.Version() || fields[1] != f.Title() || fields[2] == "0" {
					t.Errorf("ledger row %d = %q, want %s %s with its statements", i, ledger[i], f.Version(), f.Title())
				}
			}
		})
	}
}

// The in-flight runs of the fixtures load on upstream's own databases of
// every release, with 0.17's claim where the release has it.
func TestUpstreamInflightRuns(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	for _, release := range []string{"0.14.1", "0.17.1"} {
		t.Run(release, func(t *testing.T) {
			db := testdb.Upstream(t, release)
			ctx := context.Background()
			if err := fixtures.LoadInflightRuns(ctx, db.Pool); err != nil {
				t.Fatal(err)
			}
			var runs, started, messages int
			if err := db.Pool.QueryRow(ctx, `select (select count(*) from pgflow.runs),
			       (select count(*) from pgflow.step_tasks where status = 'started'),
			       (select count(*) from pgmq.q_etl) + (select count(*) from pgmq.q_fanout)`).Scan(&runs, &started, &messages); err != nil {
				t.Fatal(err)
			}
			if runs != 16 || started == 0 || messages == 0 {
				t.Fatalf("in flight: %d runs, %d started tasks, %d messages", runs, started, messages)
			}
		})
	}
}

// Without the vendored folder, the harness says where it looked (the
// folder is found from the repository root, so a missing one is a failure,
// never a skip).
func TestUpstreamFolderIsThere(t *testing.T) {
	dir := testdb.PgflowMigrationsDir(t)
	entries, err := os.ReadDir(dir + "/migrations")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	var want []string
	for _, f := range testdb.UpstreamReleaseFiles(t, testdb.NewestRelease) {
		want = append(want, f.Name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("vendored migrations %v, the newest atlas.sum lists %v", names, want)
	}
}

// Every prefix of upstream's history is detected as itself: releases by
// name (0.17.1 without the endpoint fix too), the others as where they lie.
func TestDetectUpstreamPrefixes(t *testing.T) {
	t.Logf("components: %s", testdb.UpstreamComponents())
	for _, n := range []int{20, 21, 22, 23, 24, 25, 26, 27} {
		t.Run(versions.StateName(n), func(t *testing.T) {
			db := testdb.UpstreamPrefix(t, n)
			det, err := versions.Detect(context.Background(), db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			r := det.Release
			if r == nil || r.Files != n || r.Name != versions.StateName(n) || r.LedgerFiles != n || r.Refusal() != "" {
				t.Fatalf("detected %s, release %+v", det.Summary(), r)
			}
			if n >= 24 {
				want := "upstream's newest release is " + versions.Newest
				if n == 27 {
					want = "nothing to do"
				}
				if !strings.Contains(det.NextStep, want) {
					t.Errorf("next step %q, want %q in it", det.NextStep, want)
				}
			}
		})
	}
}

// A ledger that is not a prefix of upstream's history is named and refused.
func TestDetectLedgerGap(t *testing.T) {
	db := testdb.Upstream(t, "0.17.0")
	ctx := context.Background()
	gone := versions.UpstreamFiles()[21]
	if _, err := db.Pool.Exec(ctx, `delete from supabase_migrations.schema_migrations where version = $1`, gone.Version()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `insert into supabase_migrations.schema_migrations (version, name) values ('20991231000000', 'pgflow_from_the_future')`); err != nil {
		t.Fatal(err)
	}
	det, err := versions.Detect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	r := det.Release
	if r == nil || !slices.Equal(r.LedgerGaps, []string{gone.Name}) || r.LedgerFiles != 21 ||
		!slices.Equal(r.LedgerUnknown, []string{"20991231000000_pgflow_from_the_future"}) ||
		!strings.Contains(r.Refusal(), gone.Name) || !strings.Contains(r.Refusal(), "pgflow_from_the_future") {
		t.Fatalf("release %+v; refusal %q", r, r.Refusal())
	}
}
