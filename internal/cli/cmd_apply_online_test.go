package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli/clitest"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestApplyOnlineCLI(t *testing.T) {
	db := testdb.Baseline(t)
	env := map[string]string{"PGFLOW_UPGRADE_DSN": db.DSN}
	for _, q := range []string{
		`select pgflow.create_flow('Cli_Flow')`,
		`select pgflow.add_step('Cli_Flow', 'only', step_type => 'map')`,
		`select pgflow.start_flow('Cli_Flow', '[1, 2, 3, 4, 5, 6, 7]')`,
	} {
		if _, err := db.Pool.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if r := clitest.Run(t, env, "apply", "--online", "--dry-run", "--yes"); r.Code != cli.ExitUsage {
		t.Fatalf("--online --dry-run: exit %d, want usage (%s)", r.Code, r.Stderr)
	}
	if r := clitest.Run(t, env, "apply", "--online", "--rollback-online", "--yes"); r.Code != cli.ExitUsage {
		t.Fatalf("--online --rollback-online: exit %d, want usage", r.Code)
	}

	// Stop an online upgrade after its backfill, as a kill would.
	stopOnlineAt(t, db, online.PointCheck)
	r := clitest.Run(t, env, "--format", "json", "status")
	var st struct {
		ExitCode int `json:"exit_code"`
		Online   *struct {
			Phase string `json:"phase"`
			Next  string `json:"next"`
		} `json:"online"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || st.Online == nil || st.Online.Phase != "backfill" || st.Online.Next != online.ContinueCommand {
		t.Fatalf("status of an online upgrade in progress: %v\n%s%s", err, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, env, "status"); !strings.Contains(r.Stdout, "online upgrade in progress: phase backfill; next: pgflow-upgrade apply --online") {
		t.Fatalf("status table does not show the online upgrade:\n%s", r.Stdout)
	}

	// Rolled back: the 0.16.0 baseline again, and status says so.
	if r := clitest.Run(t, env, "apply", "--rollback-online", "--yes"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "rolled_back") {
		t.Fatalf("rollback-online: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := clitest.Run(t, env, "status"); r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "schema state: baseline") || strings.Contains(r.Stdout, "online upgrade") {
		t.Fatalf("status after rollback-online: exit %d\n%s", r.Code, r.Stdout)
	}

	// The whole online upgrade through the CLI.
	r = clitest.Run(t, env, "--format", "json", "apply", "--online", "--yes", "--batch-size", "3", "--pause", "1ms")
	var rep struct {
		ExitCode int    `json:"exit_code"`
		Outcome  string `json:"outcome"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || r.Code != cli.ExitOK || rep.Outcome != "applied" {
		t.Fatalf("apply --online: exit %d, %v\n%s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	// Off a terminal the phases still show on stderr, as they happen.
	if !strings.Contains(r.Stderr, "- backfill") || !strings.Contains(r.Stderr, "done in") {
		t.Errorf("apply --online off a terminal: no progress on stderr:\n%s", r.Stderr)
	}
	if r := clitest.Run(t, env, "verify"); r.Code != cli.ExitOK {
		t.Fatalf("verify after apply --online: exit %d\n%s", r.Code, r.Stdout)
	}
	if r := clitest.Run(t, env, "apply", "--rollback-online", "--yes"); r.Code != cli.ExitFindings {
		t.Fatalf("rollback-online after the switch: exit %d, want refusal", r.Code)
	}
}
