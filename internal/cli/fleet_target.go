package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fleet"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// One target of a fleet: the single command, run in-process on an App of
// its own exactly as `pgflow-upgrade COMMAND --dsn DSN --format json`, its
// JSON document read back into the target's entry. What the entry says is
// therefore what the single command says.

// subRun is what one single command printed and returned.
type subRun struct {
	code  int
	out   []byte // its JSON document (none when it failed before one)
	cause string // its last error line on stderr, redacted
}

// runSingle runs command on t with args after the DSN and --format json.
// A --target-timeout that ends the command is exit 4 (it ran out of time;
// what it was doing rolled back), not an interrupt.
func (a *App) runSingle(ctx context.Context, r *fleetRun, t fleet.Target, command string, args ...string) subRun {
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if r.timeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, r.timeout)
	}
	defer cancel()
	var out, errOut bytes.Buffer
	child := &App{Stdout: &out, Stderr: &errOut, Stdin: strings.NewReader(""), Getenv: a.Getenv, heartbeatEvery: a.heartbeatEvery}
	code := child.Run(tctx, append([]string{"pgflow-upgrade", command, "--dsn=" + t.DSN, "--format=json"}, args...))
	cause := lastError(session.RedactText(errOut.String(), t.DSN))
	// The row names the target already.
	cause = strings.Replace(cause, "connecting to "+t.Database+" (--dsn): ", "", 1)
	s := subRun{code: code, out: out.Bytes(), cause: cause}
	if r.timeout > 0 && timedOut(tctx) && ctx.Err() == nil && code != ExitOK {
		s.code = ExitInconclusive
		s.cause = fmt.Sprintf("did not finish within --target-timeout %s (what it was doing rolled back)", r.timeout)
	}
	return s
}

// timedOut: ctx's deadline has passed. Its Err may still be nil then: the
// timer that sets it runs on its own goroutine, late on a loaded machine,
// while a dial given the same deadline has already failed with an i/o
// timeout (which would otherwise read as an unreachable server).
func timedOut(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// lastError is the error a command ends with on stderr (from its last
// line starting "pgflow-upgrade[ command]: " to the end, which may span
// lines), on one line and without that prefix.
func lastError(stderr string) string {
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(lines[i], "pgflow-upgrade"); ok {
			if _, msg, ok := strings.Cut(rest, ": "); ok {
				return strings.Join(strings.Fields(strings.Join(append([]string{msg}, lines[i+1:]...), " ")), " ")
			}
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// fleetTarget runs one target of r: the command, or for apply the resume
// decision, apply, then verify.
func (a *App) fleetTarget(ctx context.Context, r *fleetRun, t fleet.Target) fleet.Entry {
	var e fleet.Entry
	switch r.command {
	case "audit":
		e = auditEntry(a.runSingle(ctx, r, t, "audit", r.pass...))
	case "status":
		e = statusEntry(a.runSingle(ctx, r, t, "status", r.pass...))
	case "verify":
		e = verifyEntry(a.runSingle(ctx, r, t, "verify", r.pass...))
	default:
		e = a.fleetApply(ctx, r, t)
	}
	if e.ExitCode == ExitInterrupted {
		e.Status = fleet.StatusInterrupted
	} else if e.Status == "" {
		e.Status = fleet.StatusDone
	}
	return e
}

// unanswered is the entry of a command that printed no document: it
// could not connect (or was refused before it read anything).
func unanswered(s subRun) fleet.Entry {
	verdict := "ERROR"
	switch s.code {
	case ExitEnvironment:
		verdict = fleet.VerdictUnreachable
	case ExitInterrupted:
		verdict = "INTERRUPTED"
	case ExitInconclusive:
		verdict = "CANNOT TELL"
	}
	return fleet.Entry{ExitCode: s.code, Verdict: verdict, Cause: s.cause, Blockers: []fleet.Count{}, Warnings: []fleet.Count{}}
}

// catalogDigest is what the detection found the catalog to be: release,
// state, additions, differences, an unfinished online or quiesce run.
func catalogDigest(d *versions.Detection) string {
	if d == nil {
		return ""
	}
	var online, quiesce string
	if d.Online != nil {
		online = d.Online.Phase
	}
	if d.Quiesce != nil {
		quiesce = d.Quiesce.Phase
	}
	return fleet.Digest(struct {
		Found, State, Closest, Online, Quiesce string
		Exact, Shallow                         bool
		Differences, Additions                 []string
	}{d.Found, string(d.State), d.Closest, online, quiesce, d.Exact, d.Shallow,
		versionsStrings(d.Differences), versionsStrings(d.Additions)})
}

func versionsStrings[T fmt.Stringer](ds []T) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

// describe fills what the detection says into e.
func describe(e *fleet.Entry, d *versions.Detection) {
	if d == nil {
		return
	}
	e.Release, e.SchemaState, e.Summary, e.Catalog = d.Found, string(d.State), d.Summary(), catalogDigest(d)
}

// countFindings sums findings of one severity per check, in the order
// the checks came.
func countFindings(fs []audit.Finding, sev audit.Severity) []fleet.Count {
	out := []fleet.Count{}
	at := map[string]int{}
	for _, f := range fs {
		if f.Severity != sev {
			continue
		}
		i, ok := at[f.CheckID]
		if !ok {
			i = len(out)
			at[f.CheckID] = i
			out = append(out, fleet.Count{Check: f.CheckID})
		}
		out[i].Count += f.Count
	}
	return out
}

// auditEntry reads audit's document: verdict, release, blockers,
// warnings, undecided checks, the forecast lock window.
func auditEntry(s subRun) fleet.Entry {
	var doc auditJSON
	if len(s.out) == 0 || json.Unmarshal(s.out, &doc) != nil || doc.Report == nil {
		return unanswered(s)
	}
	e := fleet.Entry{ExitCode: s.code, Verdict: auditVerdict(s.code, doc.PgflowVersion, nil)}
	describe(&e, doc.PgflowVersion)
	var all []audit.Finding
	for _, c := range doc.Checks {
		all = append(all, c.Findings...)
		if c.Status == audit.StatusInconclusive || c.Status == audit.StatusError {
			e.Inconclusive = append(e.Inconclusive, c.ID)
		}
	}
	e.Blockers, e.Warnings = countFindings(all, audit.Blocker), countFindings(all, audit.Warning)
	if f := doc.Forecast; f != nil && f.Available {
		ms := f.LockWindowMS
		e.LockWindowMS = &ms
	}
	if d := doc.PgflowVersion; d != nil && d.State != versions.StateReady {
		e.Note = withoutSelf(d.NextStep, "audit") // e.g. older than 0.16.0: what to do first
	}
	return e
}

// statusEntry reads status's document: the version and its next step.
func statusEntry(s subRun) fleet.Entry {
	var doc struct {
		ExitCode int `json:"exit_code"`
		*upgrade.StatusReport
	}
	if len(s.out) == 0 || json.Unmarshal(s.out, &doc) != nil || doc.StatusReport == nil {
		return unanswered(s)
	}
	e := fleet.Entry{ExitCode: s.code, Verdict: fleet.FleetVerdict("status", s.code), Blockers: []fleet.Count{}, Warnings: []fleet.Count{}}
	describe(&e, doc.PgflowVersion)
	if doc.PgflowVersion != nil {
		e.Note = "next step: " + withoutSelf(doc.PgflowVersion.NextStep, "status")
	}
	return e
}

// verifyEntry reads verify's document: pass or fail, and what failed.
func verifyEntry(s subRun) fleet.Entry {
	var doc struct {
		ExitCode int `json:"exit_code"`
		*upgrade.VerifyReport
		Routes *routesResult `json:"routes,omitempty"`
	}
	if len(s.out) == 0 || json.Unmarshal(s.out, &doc) != nil || doc.VerifyReport == nil {
		return unanswered(s)
	}
	verdict := map[int]string{ExitOK: "PASS", ExitFindings: "FAIL", ExitInconclusive: "CANNOT TELL"}[s.code]
	e := fleet.Entry{ExitCode: s.code, Verdict: verdict, Blockers: []fleet.Count{}, Warnings: []fleet.Count{}}
	var failed []string
	for _, o := range upgrade.Failed(doc.Checks) {
		failed = append(failed, o.ID)
	}
	if doc.Routes != nil && doc.Routes.Report != nil {
		for _, f := range doc.Routes.Findings {
			failed = append(failed, "route "+f.Message)
		}
	}
	if len(failed) > 0 {
		e.Cause = "failed: " + strings.Join(failed, "; ")
	}
	// verify reads no version: its state is what passed and failed.
	e.Catalog = fleet.Digest(failed)
	return e
}
