package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// quiesceDB: the baseline's three cron jobs (one inactive), worker
// functions in both start modes (one disabled), a stopped worker.
func quiesceDB(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.Baseline(t)
	if _, err := db.Pool.Exec(context.Background(), `
		insert into pgflow.worker_functions (function_name, enabled, start_mode) values ('a-fn', true, 'http'), ('b-fn', false, 'process');
		select cron.alter_job(job_id => (select jobid from cron.job where jobname = 'pgflow_cleanup_logs'), active => false);
		insert into pgflow.workers (worker_id, queue_name, function_name, stopped_at) values ('00000000-0000-0000-0000-0000000000bb', 'x', 'a-fn', now());`); err != nil {
		t.Fatal(err)
	}
	return db
}

// recordedValues: every enabled and active flag, in one string.
func recordedValues(t *testing.T, db *testdb.DB) string {
	t.Helper()
	var s string
	if err := db.Pool.QueryRow(context.Background(), `
		select (select string_agg(function_name || '=' || enabled, ',' order by function_name) from pgflow.worker_functions) || ' ' ||
		       (select string_agg(jobname || '=' || active, ',' order by jobid) from cron.job)`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestApplyQuiesceFlags(t *testing.T) {
	db := quiesceDB(t)
	for _, args := range [][]string{
		{"--undo-quiesce", "--quiesce"}, {"--undo-quiesce", "--dry-run"}, {"--undo-quiesce", "--online"},
		{"--resume-quiesce", "--dry-run"}, {"--quiesce", "--rollback-online"}, {"--drain-timeout", "1m"},
		{"--quiesce", "--drain-timeout", "0s"},
	} {
		r := clitest.Run(t, nil, append([]string{"--dsn", db.DSN, "apply", "--yes"}, args...)...)
		if r.Code != cli.ExitUsage {
			t.Errorf("apply %v: exit %d, want %d\n%s%s", args, r.Code, cli.ExitUsage, r.Stdout, r.Stderr)
		}
	}
}

func TestApplyQuiesceCommands(t *testing.T) {
	ctx := context.Background()
	db := quiesceDB(t)
	before := recordedValues(t, db)

	// Dry run: says what it would change, changes nothing.
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--quiesce", "--dry-run", "--yes")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "--quiesce would") || !strings.Contains(r.Stdout, "worker function a-fn (http): enabled true -> false") ||
		!strings.Contains(r.Stdout, "pgflow_requeue_stalled_tasks") {
		t.Fatalf("apply --quiesce --dry-run: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("the dry run changed %s into %s", before, got)
	}
	// Nothing recorded: undo has nothing to do.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--undo-quiesce", "--yes"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "nothing to undo") {
		t.Fatalf("undo without a quiesce: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	// As a crash after the pause leaves it: status shows it and the commands.
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(ctx)
	pause := func() {
		if _, err := quiesce.Pause(ctx, conn, quiesce.ModeApply); err != nil {
			t.Fatal(err)
		}
		if got := recordedValues(t, db); !strings.Contains(got, "a-fn=false") || !strings.Contains(got, "pgflow_ensure_workers=false") {
			t.Fatalf("paused: %s", got)
		}
	}
	pause()
	r = clitest.Run(t, nil, "--dsn", db.DSN, "status")
	if r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "apply --quiesce in progress") ||
		!strings.Contains(r.Stdout, "apply --resume-quiesce --yes") || !strings.Contains(r.Stdout, "apply --undo-quiesce --yes") {
		t.Fatalf("status with a recorded quiesce: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	// A new --quiesce is refused while one is recorded.
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--quiesce", "--yes"); r.Code != cli.ExitFindings || !strings.Contains(r.Stderr, "already recorded") {
		t.Fatalf("second --quiesce: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--undo-quiesce", "--yes"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "restored") {
		t.Fatalf("undo: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("undo gave %s, want %s", got, before)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != cli.ExitOK || strings.Contains(r.Stdout, "quiesce") {
		t.Fatalf("status after undo: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}

	// Resume finishes it: upgraded, every value back.
	pause()
	r = clitest.Run(t, nil, "--dsn", db.DSN, "--format", "json", "apply", "--resume-quiesce", "--yes")
	var out struct {
		Outcome string `json:"outcome"`
		Quiesce struct {
			Restored    bool   `json:"restored"`
			Applied     bool   `json:"applied"`
			ResumedFrom string `json:"resumed_from"`
		} `json:"quiesce"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil || r.Code != cli.ExitOK || out.Outcome != "applied" ||
		!out.Quiesce.Restored || !out.Quiesce.Applied || out.Quiesce.ResumedFrom != "paused" {
		t.Fatalf("resume: exit %d (%v) %+v\n%s%s", r.Code, err, out, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("resume gave %s, want %s", got, before)
	}
}

// apply --online --quiesce: the quiesce is around the switch; every value is back.
func TestApplyOnlineQuiesce(t *testing.T) {
	db := quiesceDB(t)
	before := recordedValues(t, db)
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--online", "--quiesce", "--yes")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "quiesce:") || !strings.Contains(r.Stdout, "restored true") {
		t.Fatalf("apply --online --quiesce: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("after apply --online --quiesce: %s, want %s", got, before)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "upgraded") {
		t.Fatalf("status: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}

// A quiesce an interrupted apply --online --quiesce left: status names the
// online resume, which finishes it.
func TestApplyOnlineResumeQuiesce(t *testing.T) {
	ctx := context.Background()
	db := quiesceDB(t)
	before := recordedValues(t, db)
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(ctx)
	if _, err := quiesce.Pause(ctx, conn, quiesce.ModeOnline); err != nil {
		t.Fatal(err)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != cli.ExitFindings || !strings.Contains(r.Stdout, "pgflow-upgrade apply --online --resume-quiesce --yes") {
		t.Fatalf("status: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--online", "--resume-quiesce", "--yes"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "restored true") {
		t.Fatalf("apply --online --resume-quiesce: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if got := recordedValues(t, db); got != before {
		t.Fatalf("after the online resume: %s, want %s", got, before)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "upgraded") || strings.Contains(r.Stdout, "quiesce") {
		t.Fatalf("status after: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
