package versions

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
)

// ReleaseState is where a database sits on upstream's line of files: the
// exact release (or the prefix between releases), and how that was told.
// Catalogs cannot tell every prefix apart (file 25 and file 27 change only
// function bodies), so a digest of the function each changes decides, and
// the Supabase ledger is read for what it says (a gap in it is refused).
type ReleaseState struct {
	// Files: the database holds upstream's first Files files.
	Files int `json:"files"`
	// Name: StateName(Files), e.g. "0.17.1 without the endpoint fix".
	Name string `json:"name"`
	// Newest: upstream's newest release, where a plan goes by default.
	Newest string `json:"newest"`
	// Evidence: what told the prefix (catalog, digests, ledger).
	Evidence []string `json:"evidence"`
	// LedgerFiles: how many of upstream's files the Supabase ledger
	// records as a prefix (-1: no ledger).
	LedgerFiles int `json:"ledger_files"`
	// LedgerGaps: upstream files the ledger lacks below one it records (a
	// set that is not a prefix); LedgerUnknown: pgflow_* rows upstream's
	// history does not have. Either refuses a plan.
	LedgerGaps    []string `json:"ledger_gaps,omitempty"`
	LedgerUnknown []string `json:"ledger_unknown,omitempty"`
	// ReportUnknown: at 0.17.1's catalog, pgflow_telemetry.report() is
	// neither 0.17.1's nor the endpoint fix's (changed, or absent).
	ReportUnknown bool `json:"report_unknown,omitempty"`
}

// Refusal says why no plan may start from this state ("" when one may).
func (r *ReleaseState) Refusal() string {
	var parts []string
	if len(r.LedgerGaps) > 0 {
		parts = append(parts, fmt.Sprintf("the Supabase ledger records upstream files after ones it lacks (%s): not a prefix of upstream's history; find out how those files were skipped, apply them, or repair the ledger, before upgrading",
			strings.Join(r.LedgerGaps, ", ")))
	}
	if len(r.LedgerUnknown) > 0 {
		parts = append(parts, fmt.Sprintf("the Supabase ledger records pgflow migrations upstream's history does not have (%s): a newer or modified pgflow; this tool knows upstream's files up to %s",
			strings.Join(r.LedgerUnknown, ", "), Newest))
	}
	return strings.Join(parts, "; ")
}

// AtNewest: nothing left to do.
func (r *ReleaseState) AtNewest() bool { return r.Files == len(UpstreamFiles()) }

// catalogFiles: the prefix each catalog version stands for (0.17.0's
// catalog is also 25 files', 0.17.1's also 27 files').
var catalogFiles = map[string]int{V0_14: 20, V0_15_0: 21, V0_15_1: 22, V0_16_0: 23, V0_17_0: 24, V0_17_1: 26}

// CatalogOf is the version whose catalog a database holding upstream's
// first files files has (ok false below 0.14.1's 20 files or past the
// newest): 25 files have 0.17.0's, 27 files 0.17.1's.
func CatalogOf(files int) (v *Version, ok bool) {
	best := 0
	var name string
	for n, f := range catalogFiles {
		if f <= files && f > best {
			best, name = f, n
		}
	}
	if best == 0 || files > len(UpstreamFiles()) {
		return nil, false
	}
	v, err := Lookup(name)
	return v, err == nil
}

// Digests of the function a body-only file changes: md5 of pg_proc.prosrc
// as upstream's file leaves it (facts: a digest, not the text).
const (
	fnForceSkip = "pgflow._cascade_force_skip_steps(uuid,text,text)"
	fnReport    = "pgflow_telemetry.report()"
	// The same, as (schema, name, identity arguments) for a pg_catalog
	// read that needs no privilege on the schema.
	fnForceSkipSchema, fnForceSkipName, fnForceSkipArgs = "pgflow", "_cascade_force_skip_steps", "run_id uuid, step_slug text, skip_reason text"
	fnReportSchema, fnReportName, fnReportArgs          = "pgflow_telemetry", "report", ""
	// File 25 (20260919152659_pgflow_fix_force_skip_multi_queue).
	digestForceSkip25 = "7b30b62146beb0f7c97c79c9d72cc26d"
	// File 26 (20260920093533_pgflow_telemetry) and 27 (the endpoint fix).
	digestReport26 = "4a62568b550c06e90ad33188f694d882"
	digestReport27 = "f1b91ac4f888fff006209ecadd33ed8f"
)

// DetectRelease places a detected pgflow on upstream's line of files. It
// returns nil for a database that is no known version (not pgflow,
// unknown, an online upgrade of ours in progress).
func DetectRelease(ctx context.Context, q catalog.Querier, d *Detection) (*ReleaseState, error) {
	n, ok := catalogFiles[d.Found]
	if !ok || d.State == StateUnknown || d.State == StateNotPgflow || d.State == StateOnline {
		return nil, nil
	}
	r := &ReleaseState{Files: n, Newest: Newest, Evidence: []string{"catalog: " + d.Found}}
	switch n {
	case 24:
		got, err := functionDigest(ctx, q, fnForceSkipSchema, fnForceSkipName, fnForceSkipArgs)
		if err != nil {
			return nil, err
		}
		if got == digestForceSkip25 {
			r.Files = 25
			r.Evidence = append(r.Evidence, fnForceSkip+" is upstream's file 25's")
		}
	case 26:
		got, err := functionDigest(ctx, q, fnReportSchema, fnReportName, fnReportArgs)
		if err != nil {
			return nil, err
		}
		switch got {
		case digestReport27:
			r.Files = 27
			r.Evidence = append(r.Evidence, fnReport+" is upstream's endpoint fix's")
		case digestReport26:
			r.Evidence = append(r.Evidence, fnReport+" is 0.17.1's, without the endpoint fix")
		default:
			r.ReportUnknown = true
			r.Evidence = append(r.Evidence, fnReport+" is neither 0.17.1's nor the endpoint fix's (or absent)")
		}
	}
	if err := readLedger(ctx, q, r); err != nil {
		return nil, err
	}
	r.Name = StateName(r.Files)
	return r, nil
}

// functionDigest is md5 of a function's source, "" when it is absent.
// It reads pg_catalog only (to_regprocedure would need USAGE on the
// schema, which an audit role may lack).
func functionDigest(ctx context.Context, q catalog.Querier, schema, name, args string) (string, error) {
	var got string
	err := q.QueryRow(ctx, `select pg_catalog.md5(p.prosrc) from pg_catalog.pg_proc p
		  join pg_catalog.pg_namespace n on n.oid = p.pronamespace
		 where n.nspname = $1 and p.proname = $2 and pg_catalog.pg_get_function_identity_arguments(p.oid) = $3`,
		schema, name, args).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the digest of %s.%s: %w", schema, name, err)
	}
	return got, nil
}

// readLedger reads which of upstream's files the Supabase ledger records.
func readLedger(ctx context.Context, q catalog.Querier, r *ReleaseState) error {
	r.LedgerFiles = -1
	// pg_catalog only, then the privilege: a role that may not read the
	// ledger (an audit role) gets the catalog's answer alone.
	var exists, readable bool
	if err := q.QueryRow(ctx, `select c.oid is not null,
	           coalesce(pg_catalog.has_schema_privilege(c.relnamespace, 'USAGE') and pg_catalog.has_table_privilege(c.oid, 'SELECT'), false)
	      from (select 1) one
	      left join (pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace)
	        on n.nspname = 'supabase_migrations' and c.relname = 'schema_migrations'`).Scan(&exists, &readable); err != nil {
		return fmt.Errorf("looking for the Supabase ledger: %w", err)
	}
	if !exists {
		return nil
	}
	if !readable {
		r.Evidence = append(r.Evidence, "Supabase ledger: not readable by this role")
		return nil
	}
	// Some ledgers have no name column: coalesce over a row-to-json read
	// keeps the query valid on both shapes.
	rows, err := q.Query(ctx, `select m.version::text, coalesce(pg_catalog.to_jsonb(m)->>'name', '')
	                             from supabase_migrations.schema_migrations m order by 1`)
	if err != nil {
		return fmt.Errorf("reading the Supabase ledger: %w", err)
	}
	type row struct{ version, name string }
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.version, &x.name)
	})
	if err != nil {
		return fmt.Errorf("reading the Supabase ledger: %w", err)
	}
	// A row is upstream's file under upstream's version, or under the
	// user's copy's version (`pgflow install` renames the files
	// <new ts>_<original ts>_<name>.sql, and push records the new ts with
	// name <original ts>_<name>).
	recorded := map[string]bool{}
	known := map[string]bool{}
	for _, f := range UpstreamFiles() {
		known[f.Version()], known[f.Version()+"_"+f.Title()] = true, true
	}
	for _, x := range recs {
		recorded[x.version], recorded[x.name] = true, true
		if !known[x.version] && !known[x.name] && isPgflowName(x.name) {
			r.LedgerUnknown = append(r.LedgerUnknown, x.version+"_"+x.name)
		}
	}
	has := func(f UpstreamFile) bool { return recorded[f.Version()] || recorded[f.Version()+"_"+f.Title()] }
	last := 0
	for _, f := range UpstreamFiles() {
		if has(f) {
			last = f.Index
		}
	}
	r.LedgerFiles = 0
	for _, f := range UpstreamFiles()[:last] {
		if has(f) {
			if len(r.LedgerGaps) == 0 {
				r.LedgerFiles = f.Index
			}
			continue
		}
		r.LedgerGaps = append(r.LedgerGaps, f.Name)
	}
	if r.LedgerFiles >= 0 {
		r.Evidence = append(r.Evidence, fmt.Sprintf("Supabase ledger: %d of upstream's files", r.LedgerFiles))
	}
	return nil
}

// isPgflowName: a ledger name that is pgflow's, under upstream's name or
// pgflow install's (<original ts>_pgflow_...).
func isPgflowName(name string) bool {
	if strings.HasPrefix(name, "pgflow_") {
		return true
	}
	ts, rest, ok := strings.Cut(name, "_")
	return ok && len(ts) == 14 && strings.Trim(ts, "0123456789") == "" && strings.HasPrefix(rest, "pgflow_")
}
