package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// TestQuiesceSaysWhatItLeavesStarted: tasks started by a worker that died
// two hours ago (no heartbeat since) are not waited for by the drain, and
// the upgrade commits with them still started. Before, apply --quiesce
// said "drained in 2 ms" and nothing of them; now its output, its JSON and
// its dry run count them, name the worker and since when, and say that
// pgflow's stalled-task recovery requeues them after their timeout (and
// that its cron job runs it).
func TestQuiesceSaysWhatItLeavesStarted(t *testing.T) {
	db := quiesceDB(t)
	ctx := context.Background()
	db.Exec(t, testdb.InflightStatements(3)...)
	db.Exec(t, `update pgflow.workers set last_heartbeat_at = now() - interval '2 hours' where worker_id = '00000000-0000-0000-0000-0000000000aa'`,
		`update pgflow.step_tasks set queued_at = now() - interval '3 hours', started_at = now() - interval '2 hours' where status = 'started'`)
	var started int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.step_tasks where status = 'started'`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	if started == 0 {
		t.Fatal("the fixture started no task")
	}
	leave := fmt.Sprintf("leave %d task(s) started by 1 worker(s) that are not live", started)

	dry := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--quiesce", "--dry-run", "--yes")
	t.Logf("dry run: exit %d\n%s", dry.Code, dry.Stdout)
	if dry.Code != cli.ExitOK || !strings.Contains(flat(dry.Stdout), leave) || !strings.Contains(flat(dry.Stdout), "pgflow.requeue_stalled_tasks()") {
		t.Errorf("the dry run does not say it would %s:\n%s%s", leave, dry.Stdout, dry.Stderr)
	}

	r := clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "apply", "--quiesce", "--yes")
	var doc struct {
		Message string `json:"message"`
		Quiesce struct {
			LeftStarted struct {
				Tasks   int `json:"tasks"`
				Workers []struct {
					WorkerID string `json:"worker_id"`
					Tasks    int    `json:"tasks"`
				} `json:"workers"`
				RequeueJob bool   `json:"requeue_job"`
				Recovery   string `json:"recovery"`
			} `json:"left_started"`
		} `json:"quiesce"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil || r.Code != cli.ExitOK {
		t.Fatalf("apply --quiesce: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	l := doc.Quiesce.LeftStarted
	t.Logf("message: %s", doc.Message)
	if l.Tasks != started || len(l.Workers) != 1 || l.Workers[0].WorkerID != "00000000-0000-0000-0000-0000000000aa" || l.Workers[0].Tasks != started {
		t.Errorf("left_started: %+v, want %d task(s) of worker ...aa", l, started)
	}
	if !l.RequeueJob || !strings.Contains(l.Recovery, "requeue_stalled_tasks()") || !strings.Contains(l.Recovery, "timeout plus 30 s") ||
		!strings.Contains(l.Recovery, "the cron job pgflow_requeue_stalled_tasks runs it") {
		t.Errorf("what becomes of them: %+v", l)
	}
	want := fmt.Sprintf("%d task(s) were still started when the upgrade committed, by 1 worker(s) that are not live", started)
	if !strings.Contains(doc.Message, want) {
		t.Errorf("the message does not say %q:\n%s", want, doc.Message)
	}
	var still int
	if err := db.Pool.QueryRow(ctx, `select count(*) from pgflow.step_tasks where status = 'started'`).Scan(&still); err != nil || still != started {
		t.Fatalf("started tasks after the upgrade: %d (%v), want %d: nothing is lost or changed by it", still, err, started)
	}
}
