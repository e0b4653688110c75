package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// apply --pgmq from the command line: the usage errors (exit 2), the
// refused targets (exit 1), a dry run, the real run on 0.16.0 with
// upstream's example flow (JSON), and the pgmq hop alone with --quiesce on
// a database already at 0.17 with pgmq stopped at 1.9.0.
func TestApplyPGMQCommand(t *testing.T) {
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	ctx := context.Background()
	db := testdb.Baseline(t).AnalyzeWebsite(t)
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--pgmq", "latest"}, cli.ExitUsage, "--pgmq"},
		{[]string{"--pgmq", "1.13.1", "--online"}, cli.ExitUsage, "--pgmq runs with the transactional apply"},
		{[]string{"--pgmq", "1.10.1"}, cli.ExitFindings, "1.11.0 or later"},
		{[]string{"--pgmq", "1.42.0"}, cli.ExitFindings, "update scripts are not installed"},
	} {
		r := clitest.Run(t, nil, append([]string{"--dsn", db.DSN, "apply", "--yes"}, c.args...)...)
		if r.Code != c.code || !strings.Contains(cellText(r.Stdout+r.Stderr), c.says) {
			t.Errorf("apply %v: exit %d, want %d saying %q\n%s%s", c.args, r.Code, c.code, c.says, r.Stdout, r.Stderr)
		}
	}
	r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes", "--dry-run", "--pgmq", testdb.PGMQNewest)
	if r.Code != cli.ExitOK || !strings.Contains(cellText(r.Stdout), `pgmq.meta "analyzeWebsite" (table pgmq.q_analyzewebsite): renamed to analyzewebsite`) {
		t.Fatalf("dry run: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if v := db.PGMQVersion(t); v != "1.5.1" {
		t.Fatalf("dry run left pgmq at %s", v)
	}

	r = clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes", "--pgmq", testdb.PGMQNewest, "--format", "json")
	var doc struct {
		Outcome string `json:"outcome"`
		PGMQ    struct {
			From, To string
			Repairs  []struct{ Queue, Action string }
			Locked   []string
		} `json:"pgmq"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil || r.Code != cli.ExitOK {
		t.Fatalf("apply --pgmq: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	if p := doc.PGMQ; doc.Outcome != "applied" || p.From != "1.5.1" || p.To != testdb.PGMQNewest || len(p.Repairs) != 1 || p.Repairs[0].Queue != fixtures.AnalyzeWebsiteSlug || len(p.Locked) != 3 {
		t.Fatalf("JSON: %s", r.Stdout)
	}

	// pgflow at 0.17, pgmq stopped at 1.9.0: the pgmq hop alone, its
	// workers fenced by --quiesce.
	db2 := testdb.Baseline(t)
	db2.Exec(t, `select pgflow.create_flow('greet')`)
	if r := clitest.Run(t, nil, "--dsn", db2.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("pgflow hop: %d %s%s", r.Code, r.Stdout, r.Stderr)
	}
	db2.UpdatePGMQ(t, "1.9.0")
	// A live worker and an enabled worker function: the fence deprecates
	// the one and restores the other. The worker's last heartbeat is 57 s
	// old: live (within a minute) when the fence starts, gone (it never
	// acknowledges) a few seconds later, so the drain ends without a
	// minute's wait.
	db2.Exec(t, `insert into pgflow.workers (worker_id, queue_name, function_name, last_heartbeat_at) values ('00000000-0000-0000-0000-0000000000cc', 'greet', 'greet-fn', now() - interval '57 seconds');
		insert into pgflow.worker_functions (function_name, enabled) values ('greet-fn', true)`)
	r = clitest.Run(t, nil, "--dsn", db2.DSN, "apply", "--yes", "--quiesce", "--pgmq", testdb.PGMQNewest)
	if r.Code != cli.ExitOK || !strings.Contains(cellText(r.Stdout), "pgmq: 1.9.0 -> "+testdb.PGMQNewest) || !strings.Contains(cellText(r.Stdout+r.Stderr), "quiesce") {
		t.Fatalf("apply --quiesce --pgmq on 0.17: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if v := db2.PGMQVersion(t); v != testdb.PGMQNewest {
		t.Fatalf("pgmq %s", v)
	}
	var deprecated, enabled bool
	if err := db2.Pool.QueryRow(ctx, `select (select deprecated_at is not null from pgflow.workers where function_name = 'greet-fn'),
		(select enabled from pgflow.worker_functions where function_name = 'greet-fn')`).Scan(&deprecated, &enabled); err != nil || !deprecated || !enabled {
		t.Fatalf("after --quiesce: worker deprecated %v, function enabled %v (%v)", deprecated, enabled, err)
	}
}

// A database stopped at pgmq 1.10.1 (pgflow 0.17, queues from before
// 1.10.0): audit NO-GO and verify FAIL, both naming the broken claim path,
// status says what to run; apply --pgmq 1.13.1 mends it and verify passes.
func TestPGMQ1101AuditVerifyStatus(t *testing.T) {
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	db := testdb.Baseline(t)
	db.Exec(t, `select pgflow.create_flow('greet')`)
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes"); r.Code != cli.ExitOK {
		t.Fatalf("pgflow hop: %d %s%s", r.Code, r.Stdout, r.Stderr)
	}
	db.UpdatePGMQ(t, "1.10.1")
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "audit"); r.Code != cli.ExitFindings || !strings.Contains(cellText(r.Stdout), "pgmq.claim_path") {
		t.Errorf("audit on 1.10.1: exit %d\n%s", r.Code, r.Stdout)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "verify"); r.Code != cli.ExitFindings || !strings.Contains(cellText(r.Stdout+r.Stderr), "pgmq_claim_path") {
		t.Errorf("verify on 1.10.1: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "status"); !strings.Contains(cellText(r.Stdout), "pgmq: extension 1.10.1") || !strings.Contains(cellText(r.Stdout), "apply --pgmq 1.13.1") {
		t.Errorf("status on 1.10.1: exit %d\n%s", r.Code, r.Stdout)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "apply", "--yes", "--pgmq", testdb.PGMQNewest); r.Code != cli.ExitOK {
		t.Fatalf("apply --pgmq from 1.10.1: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, nil, "--dsn", db.DSN, "verify"); r.Code != cli.ExitOK {
		t.Errorf("verify on 1.13.1: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
