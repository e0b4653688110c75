package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/worker"
)

// imgFlow is a step-mode flow: fetch → resize, each step on its own queue.
var imgFlow = worker.Flow{Slug: "img", QueueMode: worker.QueueModeStep, Steps: []worker.Step{
	{Slug: "fetch"}, {Slug: "resize", DependsOn: []string{"fetch"}},
}}

// startImgWorker starts a package worker serving one step of imgFlow
// (stopped at cleanup).
func startImgWorker(t *testing.T, db *testdb.DB, step string) {
	t.Helper()
	ok := func(context.Context, *worker.Task) (any, error) { return true, nil }
	w, err := worker.New(db.Pool, worker.Config{Flow: imgFlow, StepSlug: step, FunctionName: step + "-fn",
		Handlers: map[string]worker.HandlerFunc{"fetch": ok, "resize": ok}, MaxPollSeconds: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
}

// waitCount waits until sql counts want rows.
func waitCount(t *testing.T, db *testdb.DB, want int, sql string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := db.Pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d rows, want %d", sql, n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stepFlowWaiting is a 0.17 database (upgraded by upgrade) with imgFlow
// compiled by fetch's worker and one run whose resize message waits with no
// worker for it.
func stepFlowWaiting(t *testing.T, upgrade func(*testing.T) *testdb.DB) *testdb.DB {
	t.Helper()
	db := upgrade(t)
	startImgWorker(t, db, "fetch")
	db.Exec(t, `select pgflow.start_flow('img', '{}'::jsonb)`)
	waitCount(t, db, 1, `select count(*) from pgmq.q_img__resize`)
	time.Sleep(300 * time.Millisecond) // older than the tests' --grace
	return db
}

// routesDoc is the part of verify's and status's JSON the tests read.
type routesDoc struct {
	ExitCode int `json:"exit_code"`
	Routes   *struct {
		Error  string `json:"error"`
		Routes []struct {
			Flow, Step, Queue, State string
			QueueMode                string `json:"queue_mode"`
			Visible, Hidden          int64
			Workers                  []struct {
				FunctionName string `json:"function_name"`
			}
		} `json:"routes"`
		Findings []struct {
			Flow, Step, Queue, State, Message, Deploy string
			Waiting                                   int64
			Since                                     *time.Time
		} `json:"findings"`
	} `json:"routes"`
}

func routesJSON(t *testing.T, r clitest.Result) routesDoc {
	t.Helper()
	var d routesDoc
	if err := json.Unmarshal([]byte(r.Stdout), &d); err != nil {
		t.Fatalf("json: %v\n%s%s", err, r.Stdout, r.Stderr)
	}
	return d
}

// TestVerifyRoutes: on databases upgraded by pgflow's own migration and by
// apply, a step-mode flow whose resize step has no worker makes verify
// --routes exit 1 naming flow, step, queue, count, since when and what to
// deploy; status shows the route with no live worker and says what to do;
// once the package worker serves resize, verify --routes exits 0.
func TestVerifyRoutes(t *testing.T) {
	testdb.SkipIfShort(t, "verify --routes on both upgrade paths, before and after the second step's worker")
	for name, upgrade := range map[string]func(*testing.T) *testdb.DB{
		"upstream migration": func(t *testing.T) *testdb.DB { db := testdb.Baseline(t); testdb.Migrate(t, db.Pool); return db },
		"apply": func(t *testing.T) *testdb.DB {
			db := testdb.Baseline(t)
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
				t.Fatalf("setup: apply: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			return db
		},
	} {
		t.Run(name, func(t *testing.T) {
			db := stepFlowWaiting(t, upgrade)
			before := testdb.State(t, db.Pool)

			r := clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes", "--grace", "200ms")
			if r.Code != cli.ExitFindings || !strings.HasPrefix(r.Stdout, "FAIL: 0 of ") {
				t.Fatalf("verify --routes: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			text := cellText(r.Stdout)
			for _, want := range []string{"2 routes, 1 without a worker that can claim", "FAIL route: flow img, step resize, queue img__resize: 1 message(s) waiting since",
				"and no live worker", "remedy: deploy a pgflow 0.17 worker for step resize of flow img"} {
				if !strings.Contains(text, want) {
					t.Errorf("verify --routes lacks %q:\n%s", want, r.Stdout)
				}
			}
			if strings.Contains(r.Stdout, "step fetch") {
				t.Errorf("verify --routes names the served step:\n%s", r.Stdout)
			}
			d := routesJSON(t, clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "verify", "--routes", "--grace", "200ms"))
			if d.ExitCode != 1 || d.Routes == nil || len(d.Routes.Findings) != 1 || d.Routes.Findings[0].Step != "resize" ||
				d.Routes.Findings[0].Queue != "img__resize" || d.Routes.Findings[0].Waiting != 1 || d.Routes.Findings[0].Since == nil {
				t.Fatalf("verify --routes JSON: %+v", d)
			}
			// --verbose adds every check and the route table.
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes", "--grace", "200ms", "--verbose"); r.Code != cli.ExitFindings ||
				!strings.Contains(r.Stdout, "LIVE WORKERS") || !strings.Contains(cellText(r.Stdout), "ok | catalog_0_17_0") {
				t.Fatalf("verify --routes --verbose: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes", "--grace", "0s"); r.Code != cli.ExitUsage {
				t.Fatalf("verify --grace 0s: exit %d, want %d\n%s", r.Code, cli.ExitUsage, r.Stderr)
			}
			// Within the default grace (20 s) the fresh message is not waiting yet.
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes"); r.Code != cli.ExitOK || !strings.HasPrefix(r.Stdout, "PASS: ") {
				t.Fatalf("verify --routes within the grace period: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			// Without --routes, verify reads the catalog only.
			if r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "verify"); r.Code != cli.ExitOK || routesJSON(t, r).Routes != nil {
				t.Fatalf("verify: exit %d\n%s", r.Code, r.Stdout)
			}

			// status: one row per route, the waiting one without a live worker.
			r = clitest.Run(t, nil, "--dsn", db.DSN, "status")
			first, _, _ := strings.Cut(r.Stdout, "\n")
			if r.Code != cli.ExitOK || !strings.HasPrefix(first, "pgflow version: pgflow 0.17") || !strings.Contains(first, "next step: ") {
				t.Fatalf("status: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
			rows := cellText(r.Stdout)
			for _, want := range []string{"img | step | fetch | img__fetch | 0 / 0 | - | fetch-fn", "img | step | resize | img__resize | 1 / 0 |"} {
				if !strings.Contains(rows, want) {
					t.Errorf("status lacks the row %q:\n%s", want, r.Stdout)
				}
			}
			d = routesJSON(t, clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "status"))
			if d.Routes == nil || len(d.Routes.Routes) != 2 || d.Routes.Routes[1].Visible != 1 || len(d.Routes.Routes[0].Workers) != 1 ||
				d.Routes.Routes[0].QueueMode != "step" {
				t.Fatalf("status JSON routes: %+v", d.Routes)
			}
			testdb.SameState(t, before, testdb.State(t, db.Pool), "verify --routes and status")

			startImgWorker(t, db, "resize")
			waitCount(t, db, 1, `select count(*) from pgflow.runs where flow_slug = 'img' and status = 'completed'`)
			r = clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes", "--grace", "200ms")
			if r.Code != cli.ExitOK || !strings.HasPrefix(r.Stdout, "PASS: 0 of ") || !strings.Contains(r.Stdout, "2 routes, 0 without a worker") {
				t.Fatalf("verify --routes with both workers: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
			}
		})
	}
}

// TestVerifyRoutesReadOnly: verify --routes needs only the read-only grants
// (USAGE, SELECT): with them it answers; a queue it may not read, or tables
// it may not read, is exit 4 (cannot tell), never a pass.
func TestVerifyRoutesReadOnly(t *testing.T) {
	db := stepFlowWaiting(t, func(t *testing.T) *testdb.DB { db := testdb.Baseline(t); testdb.Migrate(t, db.Pool); return db })
	_, usage := roleOn(t, db, `grant usage on schema pgflow, pgmq to %[1]s;`)
	r := clitest.Run(t, nil, "--dsn", usage, "verify", "--routes", "--grace", "200ms")
	if r.Code != cli.ExitInconclusive || !strings.HasPrefix(r.Stdout, "CANNOT TELL: 0 of ") || !strings.Contains(r.Stdout, "42501") {
		t.Fatalf("verify --routes without SELECT: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	_, ro := roleOn(t, db, readOnlyGrants)
	r = clitest.Run(t, nil, "--dsn", ro, "verify", "--routes", "--grace", "200ms")
	if r.Code != cli.ExitFindings || !strings.Contains(cellText(r.Stdout), "step resize, queue img__resize") {
		t.Fatalf("verify --routes with the read-only grants: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	// A queue table the role may not read (e.g. created after its grant):
	// resize's depth is unknown.
	_, partial := roleOn(t, db, readOnlyGrants+`revoke select on pgmq.q_img__resize from %[1]s;`)
	r = clitest.Run(t, nil, "--dsn", partial, "verify", "--routes", "--grace", "200ms")
	if r.Code != cli.ExitInconclusive || !strings.Contains(cellText(r.Stdout), "CANNOT TELL route: flow img, step resize, queue img__resize: permission denied") {
		t.Fatalf("verify --routes with an unreadable queue: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestVerifyRoutesThroughPooler: verify --routes and status through
// PgBouncer in transaction mode, with a plain connection string and with
// the simple protocol.
func TestVerifyRoutesThroughPooler(t *testing.T) {
	b := pooled(t)
	db := stepFlowWaiting(t, func(t *testing.T) *testdb.DB { db := testdb.Baseline(t); testdb.Migrate(t, db.Pool); return db })
	for _, mode := range []string{"", "simple_protocol"} {
		dsn := viaBouncer(t, b, db, mode)
		t.Run("mode "+mode, func(t *testing.T) { throughPooler(t, dsn) })
	}
}

func throughPooler(t *testing.T, dsn string) {
	if r := clitest.Run(t, nil, "--dsn", dsn, "verify", "--routes", "--grace", "200ms"); r.Code != cli.ExitFindings || !strings.Contains(cellText(r.Stdout), "step resize, queue img__resize") {
		t.Fatalf("verify --routes through the pooler: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", dsn, "status"); r.Code != cli.ExitOK || !strings.Contains(cellText(r.Stdout), "img | step | resize | img__resize | 1 / 0") {
		t.Fatalf("status through the pooler: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestVerifyRoutesOutOfTime: a queue table locked past --lock-timeout is
// exit 4 (cannot tell) with the SQLSTATE, and changes nothing; status shows
// the routes as unknown and keeps its exit code.
func TestVerifyRoutesOutOfTime(t *testing.T) {
	db := stepFlowWaiting(t, func(t *testing.T) *testdb.DB { db := testdb.Baseline(t); testdb.Migrate(t, db.Pool); return db })
	release := db.HoldLock(t, `lock table pgmq.q_img__resize in access exclusive mode`)
	defer release()
	start := time.Now()
	r := clitest.Run(t, nil, "--dsn", db.DSN, "verify", "--routes", "--grace", "200ms", "--lock-timeout", "200ms")
	if r.Code != cli.ExitInconclusive || !strings.HasPrefix(r.Stdout, "CANNOT TELL: 0 of ") || !strings.Contains(cellText(r.Stdout), "55P03") {
		t.Fatalf("verify --routes behind a lock: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("verify --routes waited %s behind the lock", took)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != cli.ExitOK || !strings.Contains(cellText(r.Stdout), "routes: cannot tell: reading the queue img__resize") {
		t.Fatalf("status behind a lock: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
