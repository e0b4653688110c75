package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/quiesce"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// quiesce.recorded blocks on an open apply --quiesce record with the values
// it recorded (not the disabled ones the tables hold); a role that cannot
// read the record gets a warning that says so, not silence and not an
// invented blocker.
func TestQuiesceRecorded(t *testing.T) {
	ctx := context.Background()
	db := testdb.Baseline(t)
	db.Exec(t, `insert into pgflow.worker_functions (function_name, enabled, start_mode) values ('fn-on', true, 'http'), ('fn-off', false, 'process')`)
	mustBeOK(t, only(t, db, audit.Options{}, "quiesce.recorded"), "quiesce.recorded")

	if _, err := quiesce.Pause(ctx, testdb.Connect(t, db.DSN), quiesce.ModeApply); err != nil {
		t.Fatal(err)
	}
	rep := only(t, db, audit.Options{Sample: 10}, "quiesce.recorded", "quiesce.inventory")
	f := mustFire(t, rep, "quiesce.recorded", audit.Blocker)
	if !strings.Contains(f.Message, "worker function fn-on enabled true") || !strings.Contains(f.Message, "worker function fn-off enabled false") ||
		!strings.Contains(f.Message, "pgflow_ensure_workers active true") || !strings.Contains(f.Remedy, "apply --resume-quiesce --yes") ||
		!strings.Contains(f.Remedy, "apply --undo-quiesce --yes") {
		t.Fatalf("quiesce.recorded: %+v", f)
	}
	var on map[string]any
	for _, s := range f.Samples {
		if s["name"] == "fn-on" {
			on = s
		}
	}
	if on == nil || on["recorded"] != true || on["now"] != false {
		t.Fatalf("sample of fn-on (recorded true, now false): %+v", f.Samples)
	}
	if fs := result(t, rep, "quiesce.inventory").Findings; len(fs) != 0 {
		t.Fatalf("the inventory lists the disabled values while the record is open: %+v", fs)
	}

	_, roleDSN := db.LoginRole(t, "h_audit_noq", "",
		`grant usage on schema pgflow, pgmq to %[1]s`,
		`grant select on all tables in schema pgflow, pgmq to %[1]s`)
	rep, err := audit.Run(ctx, testdb.Connect(t, roleDSN), audit.Options{Checks: []string{"schema.state", "quiesce.recorded"}})
	if err != nil {
		t.Fatal(err)
	}
	w := mustFire(t, rep, "quiesce.recorded", audit.Warning)
	if rep.Blockers() != 0 || !strings.Contains(w.Message, "cannot read") || rep.Schema.State != versions.SchemaBaseline {
		t.Fatalf("as a role without access to pgflow_upgrade: %+v", rep.Checks)
	}
}
