package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures/scenario"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fleet"
)

// fleetScenario is `fixtures replay fleet-staged`: the fleet commands over
// four throwaway databases. It lives here, beside the fleet, because the
// fleet is the command line's: package scenario cannot run it.
func fleetScenario() scenario.Scenario {
	return scenario.Scenario{Name: "fleet-staged", Run: runFleetScenario,
		Proves: "fleet audit over four 0.16.0 databases with runs in flight groups the three clean ones in one state and names the blocked one (NO-GO, exit 1); " +
			"fleet apply --canary 1 --parallel 1 upgrades the canary, stops at the blocked one (--max-failures 1) and starts nothing else; the rerun with its ledger " +
			"skips the canary (verified again) and the blocked one (same state), upgrades the rest; every row and message of every database identical, the blocked one unchanged"}
}

func runFleetScenario(ctx context.Context, env *scenario.Env) error {
	names := []string{"canary", "blocked", "second", "third"}
	dbs := make([]*scenario.DB, len(names))
	before := make([]*fingerprint.Fingerprint, len(names))
	var lines []string
	for i, name := range names {
		db, err := env.NewDB(ctx)
		if err != nil {
			return err
		}
		stmts := []string{`select pgflow.create_flow('greet')`, `select pgflow.add_step('greet', 'hello')`,
			`select pgflow.start_flow('greet', '{"n": 1}'::jsonb)`, `select pgflow.start_flow('greet', '{"n": 2}'::jsonb)`}
		if name == "blocked" {
			stmts = append(stmts, `select pgflow.create_flow('Greet')`) // a case-only alias: a blocker
		}
		for _, s := range stmts {
			if _, err := db.Pool.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %s: %w", name, s, err)
			}
		}
		if before[i], err = fingerprint.Take(ctx, db.Pool); err != nil {
			return err
		}
		dbs[i] = db
		lines = append(lines, name+" "+db.DSN)
	}
	dir, err := os.MkdirTemp("", "pgflow-upgrade-fleet-replay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	targets, ledger := filepath.Join(dir, "targets.txt"), filepath.Join(dir, "ledger.json")
	if err := os.WriteFile(targets, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}

	rep, err := fleetReplayRun(ctx, "fleet", "audit", "--targets", targets)
	if err != nil {
		return err
	}
	if len(rep.Groups) != 2 || rep.Groups[0].Size != 3 || rep.Groups[1].Like != "blocked" || rep.ExitCode != ExitFindings {
		return fmt.Errorf("fleet audit: exit %d, groups %+v; want the three clean databases in one group, the blocked one alone, exit 1", rep.ExitCode, rep.Groups)
	}
	env.Notef("fleet audit: %s", rep.HeadLine())
	args := []string{"fleet", "apply", "--yes", "--targets", targets, "--ledger", ledger, "--canary", "1", "--parallel", "1"}
	if rep, err = fleetReplayRun(ctx, args...); err != nil {
		return err
	}
	if got := statuses(rep); got != "canary=applied blocked=refused second=NOT STARTED third=NOT STARTED" || rep.ExitCode != ExitFindings {
		return fmt.Errorf("fleet apply: exit %d, %s; want the canary applied, the blocked one refused, nothing else started", rep.ExitCode, got)
	}
	env.Notef("fleet apply: %s; stopped: %s", rep.HeadLine(), strings.Join(rep.Stopped, "; "))
	if rep, err = fleetReplayRun(ctx, append(args, "--max-failures", "0")...); err != nil {
		return err
	}
	if got := statuses(rep); got != "canary=skipped blocked=skipped second=applied third=applied" {
		return fmt.Errorf("fleet apply rerun with the ledger: %s; want the canary and the blocked one skipped, the rest applied", got)
	}
	env.Notef("rerun: %s", rep.HeadLine())
	for i, db := range dbs {
		after, err := fingerprint.Take(ctx, db.Pool)
		if err != nil {
			return err
		}
		if d := fingerprint.Compare(before[i], after); len(d) > 0 || (names[i] == "blocked" && len(fingerprint.Added(before[i], after)) > 0) {
			return fmt.Errorf("%s: rows or messages changed:\n%s", names[i], fingerprint.Format(d, 10))
		}
	}
	return nil
}

// fleetReplayRun runs a fleet command in-process and reads its report.
func fleetReplayRun(ctx context.Context, args ...string) (*fleet.Report, error) {
	var out, errOut bytes.Buffer
	app := &App{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}
	code := app.Run(ctx, append(append([]string{"pgflow-upgrade"}, args...), "--format", "json"))
	var rep fleet.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("%s: exit %d, no report: %s", strings.Join(args[:2], " "), code, errOut.String())
	}
	if code != rep.ExitCode {
		return nil, errors.New("the exit code differs from the report's")
	}
	return &rep, nil
}

// statuses reads "name=verdict ..." (skipped targets by their status).
func statuses(rep *fleet.Report) string {
	var parts []string
	for _, e := range rep.Entries {
		v := e.Verdict
		if e.Status == fleet.StatusSkipped {
			v = string(e.Status)
		}
		parts = append(parts, e.Name+"="+v)
	}
	return strings.Join(parts, " ")
}
