package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// TestApplyCancelsAutovacuumOnStepTasks: a real autovacuum worker (backend
// type "autovacuum worker", which no client session can pretend to be)
// vacuums pgflow.step_tasks and holds SHARE UPDATE EXCLUSIVE on it while
// apply runs. The cluster is the test's own, so that its autovacuum can be
// made to come at once (autovacuum_naptime 1s) and, through step_tasks'
// storage parameters only, to vacuum that table slowly (cost limit 1,
// delay 100 ms: minutes for these rows) without touching other tables.
//
// What it proves: the lock-holder query names that worker as an autovacuum
// worker (no empty user, no "-" application); and apply, whose attempts on
// step_tasks wait at most half of deadlock_timeout (so PostgreSQL never
// cancels the worker for it), cancels the worker and commits instead of
// giving up with lock_busy after its retries.
func TestApplyCancelsAutovacuumOnStepTasks(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of its own and 20,000 step_tasks rows")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := pgprovider.Open(ctx, pgprovider.Options{SkipDocker: true, Settings: map[string]string{"autovacuum_naptime": "1s"}})
	if err != nil {
		t.Fatalf("a local cluster of the test's own: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	dsnValue := srv.DSNFor("postgres")
	if r := clitest.Run(t, nil, "--dsn", dsnValue, "fixtures", "load", "inflight"); r.Code != cli.ExitOK {
		t.Fatalf("fixtures load: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	pool, err := session.OpenPool(ctx, dsnValue, session.Options{Purpose: session.Admin}) // generates the rows
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := datagen.Generate(ctx, pool, datagen.Shape{Tasks: 20_000, Flows: 1, LiveRuns: 1, LiveTasksPerRun: 3}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`alter table pgflow.step_tasks set (autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
			autovacuum_vacuum_insert_threshold = 0, autovacuum_vacuum_insert_scale_factor = 0,
			autovacuum_vacuum_cost_limit = 1, autovacuum_vacuum_cost_delay = 100)`,
		// Dead rows, the data unchanged.
		`update pgflow.step_tasks set attempts_count = attempts_count where task_index % 10 = 0`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}

	// The autovacuum worker, once it holds step_tasks.
	var avPID int32
	deadline := time.Now().Add(2 * time.Minute)
	for avPID == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no autovacuum worker took pgflow.step_tasks within 2 minutes")
		}
		_ = pool.QueryRow(ctx, `select a.pid from pg_catalog.pg_stat_activity a
			join pg_catalog.pg_locks l on l.pid = a.pid and l.granted and l.relation = 'pgflow.step_tasks'::pg_catalog.regclass
			where a.backend_type = 'autovacuum worker' limit 1`).Scan(&avPID)
		time.Sleep(100 * time.Millisecond)
	}

	conn := testdb.Connect(t, dsnValue)
	defer conn.Close(context.Background())
	holders, err := upgrade.LockHolders(ctx, conn, "step_tasks", "access exclusive")
	if err != nil {
		t.Fatal(err)
	}
	var named bool
	for _, h := range holders {
		t.Logf("holder: %s", h)
		if h.PID == avPID {
			s := h.String()
			named = h.Autovacuum() && strings.Contains(s, "autovacuum worker") && !strings.Contains(s, "user") && !strings.Contains(s, "application")
		}
	}
	if !named {
		t.Errorf("the autovacuum worker pid %d is not named as one among the lock holders", avPID)
	}

	r := clitest.Run(t, nil, "--dsn", dsnValue, "--format", "json", "apply", "--yes", "--lock-retries", "2")
	t.Logf("apply: exit %d\n%s", r.Code, r.Stderr)
	var rep struct {
		Outcome             string `json:"outcome"`
		Message             string `json:"message"`
		AutovacuumCancelled int    `json:"autovacuum_cancelled"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("apply's JSON: %v\n%s", err, r.Stdout)
	}
	if r.Code != cli.ExitOK || rep.Outcome != string(outcome.Applied) {
		t.Fatalf("apply with an autovacuum on step_tasks: exit %d, outcome %s: %s", r.Code, rep.Outcome, rep.Message)
	}
	if rep.AutovacuumCancelled < 1 {
		t.Errorf("apply committed but reports %d autovacuum workers cancelled", rep.AutovacuumCancelled)
	}
}
