// Package audit is the list of pre-upgrade checks and their read-only
// runner (`pgflow-upgrade audit`). `apply` runs the same checks as
// its preflight, inside its own transaction and under its locks
// (RunPreflight). Each check declares when it runs (Runs: InAudit,
// BeforeLocks, UnderLocks) and for which hop (Hop: the upstream file whose
// hop brings it, or EveryPlan); each runner selects by those declarations
// (For). A hop's own checks (checks_hops.go) run in the audit within
// plan.hops, for a plan that takes the hop, and in apply right before it.
//
// # The checks
//
// Checks() lists every Check in a fixed order (allChecks, written out in
// checks.go: the checks of every plan, then each hop's); each is one value, defined beside its function in the file of
// its family (checks_<family>.go, the family being the ID's prefix): a stable ID (e.g. "flows.case_alias"), a
// default Severity, what a finding means, what to do about it, and a Run
// function that is handed the Check itself (so its findings carry its ID,
// severity and remedy without looking anything up) and issues a few queries
// through a Querier (a pgx.Tx satisfies it). A check returns Findings; no findings means the
// check passed. The checks predict every way the real pgflow 0.16.0 →
// upstream 0.17.0 migration fails or is refused (case-only aliases of flows
// and of steps, slugs breaking 0.17's stricter rule, lower(flow_slug) over
// pgmq's 47 characters, duplicate (queue, message id) pairs), plus what an
// operator must know before it (unowned queues, live 0.16.0 workers, locks,
// sizes, backups).
//
// # Exact or inconclusive
//
// Every check answers for the whole database or says it did not. A count
// is exact; only samples are bounded (Env.Sample). A check that runs out of
// its time budget (statement_timeout 57014, lock_timeout 55P03, or its own
// deadline between queries) is "inconclusive", and when it was reading a
// table it says how far it got: "examined N of about M rows" (Coverage,
// from a *PartialError). It never reports "ok" after a subset. The one
// check over a big table (tasks.duplicate_message_id) walks step_tasks in
// message-id ranges of about Env.Bound rows, so an interrupted run still
// knows how many rows it decided.
//
// Both modes run the same SQL:
//
//   - ModeAudit: the runner's own READ ONLY transaction per check.
//   - ModePreflight: the caller's transaction (apply, under its table locks),
//     each check in a savepoint that is rolled back afterwards.
//
// Checks never write, never take a lock stronger than ACCESS SHARE, and read
// pgmq's physical layout only from the system catalogs (pg_class,
// pg_attribute, pg_index, attidentity) and pgmq.list_queues(); queue rows
// are never read.
//
// # Running
//
//	rep, err := audit.Run(ctx, conn, audit.Options{Sample: 5})
//
// Run gives each check its own READ ONLY transaction with SET LOCAL
// statement_timeout, lock_timeout, idle_in_transaction_session_timeout and
// application_name (inside the transaction, so they hold through a
// transaction-mode pooler), a per-check budget and a total budget.
//
//	results, err := audit.RunPreflight(ctx, tx, audit.Options{})
//
// RunPreflight runs the checks declared UnderLocks (for every plan, or for
// Options.Hop) in the caller's transaction: each inside a savepoint that is always rolled back afterwards
// (checks are read-only, so nothing is lost), which also undoes the
// per-check settings and releases any lock the check took. A failing check
// does not abort the caller's transaction. Blockers(results) tells apply
// whether to refuse.
//
// The JSON form of Report is a stable schema, documented in docs/audit.md.
package audit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Severity of a finding.
type Severity string

const (
	Blocker Severity = "blocker" // the upgrade must not run while this holds
	Warning Severity = "warning" // the upgrade can run; act on it first or know the consequence
	Info    Severity = "info"    // for the record (sizes, versions, state)
)

// Mode says where a check runs.
type Mode int

const (
	// ModeAudit: the audit's own READ ONLY transaction, bounded and sampled.
	ModeAudit Mode = iota
	// ModePreflight: inside apply's transaction under its locks, exact.
	ModePreflight
)

func (m Mode) String() string {
	if m == ModePreflight {
		return "preflight"
	}
	return "audit"
}

// Querier is what a check queries through. pgx.Tx (and *pgx.Conn) satisfy it.
type Querier = session.Querier

// Env is what the runner tells a check.
type Env struct {
	Mode Mode
	// Sample is the most sample rows a finding carries.
	Sample int
	// Bound is the number of rows one query of a chunked scan looks at
	// (tasks.duplicate_message_id walks step_tasks in message-id ranges of
	// about this many rows). It never limits a count: counts are exact.
	Bound int64
	// Deadline is when the check's budget runs out; checks that issue one
	// query per queue stop (inconclusive) once it has passed. Zero: none.
	Deadline time.Time
	// Schema is the detected pgflow schema (filled by the runner before the
	// checks run).
	Schema versions.SchemaInfo
	// PGMQ says which pgmq the database has (filled by the runner).
	PGMQ pgmqver.Found
	// LongTransaction and IdleInTransaction are the session thresholds of
	// sessions.long_transactions (defaults 30 s and 10 s).
	LongTransaction, IdleInTransaction time.Duration
	// LiveWorker: a worker whose last heartbeat is more recent than this is
	// alive (workers.legacy_alive; default 1 minute, 12 heartbeats).
	LiveWorker time.Duration
}

// chunkRows is the rows per query of a chunked scan (Env.Bound or the default).
func (e Env) chunkRows() int64 {
	if e.Bound > 0 {
		return e.Bound
	}
	return defaultBound
}

// Finding is one problem (or fact) a check found.
type Finding struct {
	CheckID  string   `json:"check"`
	Severity Severity `json:"severity"`
	// Count is how many objects/rows the finding concerns, exact. AtLeast is
	// kept in the JSON for compatibility and is always false: a check that
	// could not count everything is inconclusive instead.
	Count   int64  `json:"count"`
	AtLeast bool   `json:"at_least"`
	Message string `json:"message"`
	Remedy  string `json:"remedy"`
	// Samples holds at most Env.Sample rows (column → value; message ids and
	// other bigints are strings).
	Samples []map[string]any `json:"samples"`
}

// Requirement is what a check needs before it can run.
type Requirement int

const (
	NeedsNothing Requirement = 0
	NeedsPgflow  Requirement = 1 << iota // the pgflow tables exist (state baseline, upgraded or partial with tables)
	NeedsPGMQ                            // schema pgmq with list_queues()
)

// Moment is a moment a check runs at. A check declares the set of its
// moments (Check.Runs), and each runner selects the checks declared for
// its own. What runs after the change (apply's post-conditions, verify) is
// not a Check but an upgrade.PostCondition: it asks whether the change is
// right, with an ok and a detail, not findings.
type Moment uint8

const (
	// InAudit: `pgflow-upgrade audit`, read only, bounded (Run). A hop's
	// checks run there within plan.hops, when the plan has the hop.
	InAudit Moment = 1 << iota
	// BeforeLocks: apply, before it takes any table lock (a role that
	// cannot upgrade never queues for one), and a hop's check before apply
	// builds anything for that hop beforehand (in a read-only transaction
	// of its own).
	BeforeLocks
	// UnderLocks: apply's preflight, in its transaction under its table
	// locks, exact (RunPreflight): the checks of every plan right after the
	// locks, a hop's checks right before that hop.
	UnderLocks
)

// Has says whether m includes every moment of x.
func (m Moment) Has(x Moment) bool { return m&x == x }

// HopFile names the hop a check belongs to: the 1-based index of the
// upstream file whose hop brings the check (see versions.UpstreamFiles).
// Such a check runs only for a plan that takes that hop, and under the
// locks right before it; EveryPlan is a check of every plan.
type HopFile int

// EveryPlan: the check is not a hop's own; it runs whatever the plan.
const EveryPlan HopFile = 0

// Check is one check: what it is, when it runs, and the function that runs it.
type Check struct {
	ID       string
	Title    string
	Severity Severity // the severity of its findings (a few checks vary it per finding)
	Meaning  string   // what a finding means
	Remedy   string   // what to do about it
	// Runs: the moments it runs at.
	Runs Moment
	// Hop: the hop that brings it, or EveryPlan.
	Hop   HopFile
	Needs Requirement
	// Run runs the check; c is the check itself (its findings are c's).
	Run func(ctx context.Context, c Check, q Querier, env Env) ([]Finding, error)
}

// Family is the check's family: its ID's prefix ("flows" for
// "flows.case_alias"), which names the file it is defined in.
func (c Check) Family() string {
	family, _, _ := strings.Cut(c.ID, ".")
	return family
}

// finding builds a finding of c with its default severity and remedy.
func (c Check) finding(count int64, msg string, samples []map[string]any) Finding {
	if samples == nil {
		samples = []map[string]any{} // JSON: always an array
	}
	return Finding{CheckID: c.ID, Severity: c.Severity, Count: count,
		Message: msg, Remedy: c.Remedy, Samples: samples}
}

// Checks returns every check in its fixed order.
func Checks() []Check {
	out := make([]Check, len(allChecks))
	copy(out, allChecks)
	return out
}

// For returns the checks declared to run at moment m for hop (EveryPlan:
// the checks of every plan), in their fixed order.
func For(m Moment, hop HopFile) []Check { return declared(allChecks, m, hop) }

// declared returns the checks of list declared for moment m and hop.
func declared(list []Check, m Moment, hop HopFile) []Check {
	var out []Check
	for _, c := range list {
		if c.Runs.Has(m) && c.Hop == hop {
			out = append(out, c)
		}
	}
	return out
}

// IDs lists the check IDs in their fixed order.
func IDs() []string {
	ids := make([]string, len(allChecks))
	for i, c := range allChecks {
		ids[i] = c.ID
	}
	return ids
}

// Lookup returns the check with id, or an error naming the known IDs.
func Lookup(id string) (Check, error) {
	for _, c := range allChecks {
		if c.ID == id {
			return c, nil
		}
	}
	known := IDs()
	sort.Strings(known)
	return Check{}, fmt.Errorf("unknown check %q (known: %s)", id, strings.Join(known, ", "))
}
