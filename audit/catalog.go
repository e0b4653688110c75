// Package audit is the catalog of pre-upgrade checks and their read-only,
// bounded runner (`pgflow-upgrade audit`, SPEC §3). `apply` runs the same
// catalog as its preflight, exact, inside its own transaction and under its
// locks (RunPreflight).
//
// # The catalog
//
// Catalog() lists every Check in a fixed order; each has a stable ID (e.g.
// "flows.case_alias"), a default Severity, what a finding means, what to do
// about it, and a Run function that issues a few small queries through a
// Querier (a pgx.Tx satisfies it). A check returns Findings; no findings
// means the check passed. Run is written for both modes:
//
//   - ModeAudit: the runner's own READ ONLY transaction; every query that
//     could touch many rows looks at no more than Env.Bound rows (a LIMIT in a
//     subquery) and reports Count with AtLeast set when it hit that bound.
//     Queue rows (pgmq.q_*) are read only here and in preflight: plain
//     SELECTs, ACCESS SHARE, bounded.
//   - ModePreflight: the caller's transaction (apply, under its table locks);
//     Env.Bound is 0 (no bound), so counts are exact.
//
// Checks never write, never take a lock stronger than ACCESS SHARE, and read
// pgmq's physical layout only from the system catalogs (pg_class,
// pg_attribute, pg_index, attidentity) and pgmq.list_queues() — never
// sequences or pg_depend.
//
// # Running
//
//	rep, err := audit.Run(ctx, conn, audit.Options{Sample: 5})
//
// Run gives each check its own READ ONLY transaction with SET LOCAL
// statement_timeout, lock_timeout, idle_in_transaction_session_timeout and
// application_name (inside the transaction, so they hold through a
// transaction-mode pooler), a per-check budget and a total budget. A check
// that runs out of time (SQLSTATE 57014 query_canceled or 55P03
// lock_not_available) is "inconclusive"; the others still run.
//
//	results, err := audit.RunPreflight(ctx, tx, audit.Options{})
//
// RunPreflight runs the checks with Preflight set, exactly, in the caller's
// transaction: each inside a savepoint that is always rolled back afterwards
// (checks are read-only, so nothing is lost), which also undoes the
// per-check statement_timeout and releases any lock the check took. A failing
// check does not abort the caller's transaction. Blockers(results) tells
// apply whether to refuse.
//
// The JSON form of Report is a stable schema, documented in docs/audit.md.
package audit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Severity of a finding.
type Severity string

const (
	Blocker Severity = "blocker" // the upgrade must not run while this holds
	Warning Severity = "warning" // the upgrade can run; act on it first or know the consequence
	Info    Severity = "info"    // for the record (sizes, versions, state)
)

// rank orders severities for output: blocker first.
func (s Severity) rank() int {
	switch s {
	case Blocker:
		return 0
	case Warning:
		return 1
	}
	return 2
}

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
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Env is what the runner tells a check.
type Env struct {
	Mode Mode
	// Sample is the most sample rows a finding carries.
	Sample int
	// Bound is the most rows a counting query looks at (ModeAudit); 0 means
	// no bound (ModePreflight: exact).
	Bound int64
	// Deadline is when the check's budget runs out; checks that issue one
	// query per queue stop (inconclusive) once it has passed. Zero: none.
	Deadline time.Time
	// Schema is the detected pgflow schema (filled by the runner before the
	// checks run).
	Schema SchemaInfo
	// PGMQ says which pgmq the database has (filled by the runner).
	PGMQ PGMQInfo
	// LongTransaction and IdleInTransaction are the session thresholds of
	// sessions.long_transactions (defaults 30 s and 10 s).
	LongTransaction, IdleInTransaction time.Duration
}

// bounded says whether counting queries are bounded.
func (e Env) bounded() bool { return e.Bound > 0 }

// limit is the LIMIT argument for a bounded subquery: nil (no limit) when
// exact, else at most n (n > 0).
func (e Env) limit(n int64) any {
	if !e.bounded() {
		return nil
	}
	return n
}

// Finding is one problem (or fact) a check found.
type Finding struct {
	CheckID  string   `json:"check"`
	Severity Severity `json:"severity"`
	// Count is how many objects/rows the finding concerns; with AtLeast the
	// check hit its bound and the real number may be higher.
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

// Check is one entry of the catalog.
type Check struct {
	ID       string
	Title    string
	Severity Severity // the severity of its findings (a few checks vary it per finding)
	Meaning  string   // what a finding means
	Remedy   string   // what to do about it
	// Preflight: apply runs this check, exactly, under its locks.
	Preflight bool
	Needs     Requirement
	Run       func(ctx context.Context, q Querier, env Env) ([]Finding, error)
}

// finding builds a finding of c with its default severity and remedy.
func (c Check) finding(count int64, atLeast bool, msg string, samples []map[string]any) Finding {
	if samples == nil {
		samples = []map[string]any{} // JSON: always an array
	}
	return Finding{CheckID: c.ID, Severity: c.Severity, Count: count, AtLeast: atLeast,
		Message: msg, Remedy: c.Remedy, Samples: samples}
}

// Catalog returns every check in its fixed order.
func Catalog() []Check {
	out := make([]Check, len(catalog))
	copy(out, catalog)
	return out
}

// IDs lists the check IDs in catalog order.
func IDs() []string {
	ids := make([]string, len(catalog))
	for i, c := range catalog {
		ids[i] = c.ID
	}
	return ids
}

// Lookup returns the check with id, or an error naming the known IDs.
func Lookup(id string) (Check, error) {
	for _, c := range catalog {
		if c.ID == id {
			return c, nil
		}
	}
	known := IDs()
	sort.Strings(known)
	return Check{}, fmt.Errorf("unknown check %q (known: %s)", id, strings.Join(known, ", "))
}

// catalog is filled by init in checks.go, in output order.
var catalog []Check
