package audit_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// audit runs the whole catalog (or ids) on db.
func runAudit(t *testing.T, db *testdb.DB, opts audit.Options) *audit.Report {
	t.Helper()
	rep, err := audit.Run(context.Background(), testdb.Connect(t, db.DSN), opts)
	if err != nil {
		t.Fatalf("audit.Run: %v", err)
	}
	return rep
}

// result returns the CheckResult of id.
func result(t *testing.T, rep *audit.Report, id string) audit.CheckResult {
	t.Helper()
	for _, r := range rep.Checks {
		if r.ID == id {
			return r
		}
	}
	t.Fatalf("no result for %s", id)
	return audit.CheckResult{}
}

// fired returns the findings of id with severity sev, failing the test when
// the check did not run cleanly.
func fired(t *testing.T, rep *audit.Report, id string, sev audit.Severity) []audit.Finding {
	t.Helper()
	r := result(t, rep, id)
	if r.Status == audit.StatusError || r.Status == audit.StatusInconclusive || r.Status == audit.StatusSkipped {
		t.Fatalf("%s: status %s: %s", id, r.Status, r.Error)
	}
	var out []audit.Finding
	for _, f := range r.Findings {
		if f.Severity == sev {
			out = append(out, f)
		}
	}
	return out
}

// mustFire asserts id has exactly one finding of severity sev and returns it.
func mustFire(t *testing.T, rep *audit.Report, id string, sev audit.Severity) audit.Finding {
	t.Helper()
	fs := fired(t, rep, id, sev)
	if len(fs) != 1 {
		t.Fatalf("%s: %d %s findings, want 1: %+v", id, len(fs), sev, result(t, rep, id).Findings)
	}
	return fs[0]
}

// mustBeOK asserts id ran and found nothing.
func mustBeOK(t *testing.T, rep *audit.Report, id string) {
	t.Helper()
	r := result(t, rep, id)
	if r.Status != audit.StatusOK {
		t.Fatalf("%s: status %s (%s), findings %+v; want ok", id, r.Status, r.Error, r.Findings)
	}
}

// sampleHas says whether some sample has key == want (compared as text).
func sampleHas(f audit.Finding, key, want string) bool {
	for _, s := range f.Samples {
		if v, ok := s[key]; ok && strings.Contains(toText(v), want) {
			return true
		}
	}
	return false
}

func toText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		var parts []string
		for _, e := range x {
			parts = append(parts, toText(e))
		}
		return strings.Join(parts, ",")
	}
	return strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(fmtAny(v), "\n", " "), "  ", " "))
}

func fmtAny(v any) string { return fmt.Sprint(v) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
