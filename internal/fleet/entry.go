// Package fleet runs one of the tool's commands (audit, status, verify,
// apply then verify) over many databases: the targets file, the order in
// which they run (canaries, a parallel pool, a failure limit, Ctrl-C), the
// ledger a rerun resumes from, shards for a CI matrix, and the one report
// (table, JSON, Markdown, JUnit) with databases grouped by state.
//
// The package knows nothing of how a target is audited or upgraded: the
// command line runs, for each target, the very command a person would run
// on it alone (in-process) and hands back an Entry, so a target's verdict,
// exit code, blockers and forecast are that command's.
package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Status is where a target stands in a run.
type Status string

const (
	// StatusDone: its command ran to the end; ExitCode says how it went.
	StatusDone Status = "done"
	// StatusSkipped: a rerun found it settled in the ledger: at the
	// destination (checked again), or failed before in the same state.
	StatusSkipped Status = "skipped"
	// StatusNotStarted: the run stopped before it (a canary failed, the
	// failure limit, an interrupt).
	StatusNotStarted Status = "not_started"
	// StatusRunning: in the ledger while its command runs; a ledger that
	// still says so after the run was killed.
	StatusRunning Status = "running"
	// StatusInterrupted: Ctrl-C reached it while it ran; what it was doing
	// rolled back (or had committed: a rerun checks).
	StatusInterrupted Status = "interrupted"
)

// Count is one check's findings: its ID and how many.
type Count struct {
	Check string `json:"check"`
	Count int64  `json:"count"`
}

// Phase is one command run on a target: apply, then verify.
type Phase struct {
	Command  string `json:"command"`
	ExitCode int    `json:"exit_code"`
	Outcome  string `json:"outcome,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Entry is one target's result, in the ledger and the report. Everything
// but the times is what its command found: two runs on databases in the
// same state give equal entries.
type Entry struct {
	Name     string `json:"name"`
	Line     int    `json:"line"`
	Database string `json:"database"` // user@host:port/database, no password
	Status   Status `json:"status"`
	ExitCode int    `json:"exit_code"`
	// Verdict is the command's answer in a word: GO, NO-GO, CANNOT TELL
	// (audit), PASS, FAIL (verify), the apply outcome, UNREACHABLE.
	Verdict string `json:"verdict"`
	// Release is the pgflow release found ("0.16.0"), "" when unknown.
	Release string `json:"release,omitempty"`
	// SchemaState is the tool's state name (ready, upgraded, ...).
	SchemaState string `json:"schema_state,omitempty"`
	// Summary: the version line the single command prints.
	Summary      string   `json:"summary,omitempty"`
	Blockers     []Count  `json:"blockers"`
	Warnings     []Count  `json:"warnings"`
	Inconclusive []string `json:"inconclusive,omitempty"`
	// LockWindowMS: audit's forecast of apply's lock window, or the window
	// apply measured; nil when there is none.
	LockWindowMS *int64 `json:"lock_window_ms,omitempty"`
	// Catalog: a digest of what the catalog was found to be (release,
	// additions, differences, pgmq, an unfinished online or quiesce run).
	Catalog string `json:"catalog,omitempty"`
	// Cause: why it failed or was not reached, one line, no password.
	Cause string `json:"cause,omitempty"`
	// Note: what a rerun did with it (skipped, audited again, ...).
	Note   string  `json:"note,omitempty"`
	Phases []Phase `json:"phases,omitempty"`

	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// Reached says the target's command got an answer from the database (its
// catalog was read): it has a state to be grouped by.
func (e *Entry) Reached() bool { return e.Catalog != "" }

// StateKey is what makes two targets "in the same state": the same
// catalog, verdict, and the same blocker, warning and undecided checks.
// One review of a group covers every database in it.
func (e *Entry) StateKey() string {
	if !e.Reached() {
		return ""
	}
	ids := func(cs []Count) []string {
		out := make([]string, len(cs))
		for i, c := range cs {
			out[i] = c.Check
		}
		return out
	}
	return digest(struct {
		Catalog, Verdict                 string
		Blockers, Warnings, Inconclusive []string
	}{e.Catalog, e.Verdict, ids(e.Blockers), ids(e.Warnings), e.Inconclusive})
}

// ResumeKey is what a rerun compares to tell whether a failed target's
// state changed since: its catalog and its blockers with their counts.
func (e *Entry) ResumeKey() string {
	if !e.Reached() {
		return ""
	}
	return digest(struct {
		Catalog  string
		Blockers []Count
	}{e.Catalog, e.Blockers})
}

// Digest is a short stable digest of v's JSON form.
func Digest(v any) string { return digest(v) }

func digest(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain data only
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// Failed says the target failed in this run: it counts against
// --max-failures. (A target a rerun skips because it failed before in the
// same state does not: it is known, and reported with its old result.)
func (e *Entry) Failed() bool { return e.Status == StatusDone && e.ExitCode != 0 }
