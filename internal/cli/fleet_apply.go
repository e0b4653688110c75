package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fleet"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// atDestination: apply outcomes that leave a target upgraded.
var atDestination = map[string]bool{string(outcome.Applied): true, string(outcome.AlreadyApplied): true}

// fleetApply is one target of fleet apply. With a ledger entry from an
// earlier run it resumes:
//   - at the destination then (applied, already applied): verify again;
//     it passes: skipped; it fails: the state changed, apply again;
//   - failed then, and no --retry-failed: audit again (read-only); the
//     same catalog and blockers: skipped with its old result; changed:
//     applied when the audit says GO, else the audit's answer;
//   - running (the run was killed), interrupted, not started, unreachable:
//     apply (a killed apply rolled back; one that had committed is
//     "already applied" now).
func (a *App) fleetApply(ctx context.Context, r *fleetRun, t fleet.Target) fleet.Entry {
	prev := r.ledger.Previous(t)
	note := ""
	if prev != nil && (prev.Status == fleet.StatusDone || prev.Status == fleet.StatusSkipped) {
		switch {
		case prev.ExitCode == ExitOK && atDestination[prev.Verdict]:
			v := verifyEntry(a.runSingle(ctx, r, t, "verify"))
			if v.ExitCode == ExitOK {
				e := *prev
				e.Status, e.Note = fleet.StatusSkipped, "at the destination in the ledger; verify passes again: skipped"
				e.StartedAt, e.FinishedAt = nil, nil
				return e
			}
			if v.ExitCode == ExitInterrupted {
				return v
			}
			note = "the ledger had it upgraded, but verify now says " + v.Verdict + ": applied again; "
		case prev.ExitCode != ExitOK && prev.Reached() && !r.retry:
			au := auditEntry(a.runSingle(ctx, r, t, "audit"))
			if au.ExitCode == ExitInterrupted {
				return au
			}
			if au.Reached() && au.ResumeKey() == prev.ResumeKey() {
				e := *prev
				e.Status = fleet.StatusSkipped
				e.Note = fmt.Sprintf("failed in the ledger (exit %d) and in the same state now: not retried (--retry-failed retries it)", prev.ExitCode)
				e.StartedAt, e.FinishedAt = nil, nil
				return e
			}
			if au.ExitCode != ExitOK {
				au.Note = "failed in the ledger; its state changed since: audited again, not applied (the audit's answer)"
				return au
			}
			note = "failed in the ledger; its state changed since and the audit says GO: applied; "
		case prev.ExitCode != ExitOK && r.retry:
			note = "failed in the ledger: retried (--retry-failed); "
		}
	}
	e := applyEntry(a.runSingle(ctx, r, t, "apply", append([]string{"--yes"}, r.pass...)...))
	if !e.Reached() && e.Phases[0].Outcome != "" {
		// apply --online reports no version: status reads the state the
		// target is in now (what a rerun compares with).
		st := statusEntry(a.runSingle(ctx, r, t, "status"))
		e.Release, e.SchemaState, e.Summary, e.Catalog = st.Release, st.SchemaState, st.Summary, st.Catalog
	}
	if e.ExitCode == ExitOK && atDestination[e.Verdict] {
		v := verifyEntry(a.runSingle(ctx, r, t, "verify"))
		e.Phases = append(e.Phases, fleet.Phase{Command: "verify", ExitCode: v.ExitCode, Outcome: v.Verdict, Message: v.Cause})
		if v.ExitCode != ExitOK {
			e.ExitCode, e.Verdict, e.Cause = v.ExitCode, "verify "+v.Verdict, "applied, then verify: "+v.Cause
		}
	}
	e.Note = note + e.Note
	return e
}

// applyDoc is what the fleet reads of apply's document, transactional or
// --online (whose report has no pgflow_version and names its lock window
// longest_lock_window_ms).
type applyDoc struct {
	Outcome       outcome.Outcome     `json:"outcome"`
	Message       string              `json:"message"`
	PgflowVersion *versions.Detection `json:"pgflow_version"`
	VersionNow    string              `json:"pgflow_version_now"`
	Preflight     []audit.CheckResult `json:"preflight"`
	Blockers      []audit.Finding     `json:"blockers"`
	LockAttempts  int                 `json:"lock_attempts"`
	LockWindowMS  int64               `json:"lock_window_ms"`
	LongestLockMS *int64              `json:"longest_lock_window_ms"`
}

// applyEntry reads apply's document: the outcome, the release found
// before, blockers and warnings of the preflight, the lock window.
func applyEntry(s subRun) fleet.Entry {
	var doc applyDoc
	if len(s.out) == 0 || json.Unmarshal(s.out, &doc) != nil || doc.Outcome == "" {
		e := unanswered(s)
		e.Phases = []fleet.Phase{{Command: "apply", ExitCode: s.code, Message: s.cause}}
		return e
	}
	e := fleet.Entry{ExitCode: s.code, Verdict: string(doc.Outcome)}
	describe(&e, doc.PgflowVersion)
	if doc.VersionNow != "" {
		e.Summary += "; now pgflow " + doc.VersionNow
	}
	var warnings []audit.Finding
	for _, c := range doc.Preflight {
		warnings = append(warnings, c.Findings...)
		if c.Status == audit.StatusInconclusive || c.Status == audit.StatusError {
			e.Inconclusive = append(e.Inconclusive, c.ID)
		}
	}
	e.Blockers, e.Warnings = countFindings(doc.Blockers, audit.Blocker), countFindings(warnings, audit.Warning)
	switch {
	case doc.LongestLockMS != nil:
		e.LockWindowMS = doc.LongestLockMS
	case doc.LockAttempts > 0 && doc.Outcome != outcome.LockBusy:
		ms := doc.LockWindowMS
		e.LockWindowMS = &ms
	}
	if s.code != ExitOK {
		e.Cause = doc.Message
	}
	e.Phases = []fleet.Phase{{Command: "apply", ExitCode: s.code, Outcome: string(doc.Outcome), Message: doc.Message}}
	return e
}
