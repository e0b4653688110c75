// Package upgrade implements `pgflow-upgrade apply`, `status` and `verify`:
// the change from real pgflow 0.16.0 to upstream's 0.17.0 run safely in one
// transaction, and the read-only questions asked before and after it.
//
// Every run that changes the database (Apply, with or without --quiesce;
// online.Upgrade; online.Rollback; UndoQuiesce) returns an *outcome.Result,
// never nil, and an error, by the rule package outcome states.
package upgrade

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/catalog"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Querier is what the read-only checks need: a connection or a transaction.
type Querier = session.Querier

// PostCondition is one post-upgrade condition, the checks of the moment
// after the change (not an audit.Check, whose moments all come before it:
// it asks whether the change is right, with an ok and a detail, not
// findings): a catalog query that returns (ok boolean, detail text), or a
// Go function. The same list is the
// post-condition of `apply` (inside its transaction, before commit) and
// the body of `verify`.
type PostCondition struct {
	ID    string
	Title string
	// SQL returns one row (ok boolean, detail text). It must be cheap: in
	// `apply` it runs while step_tasks is ACCESS EXCLUSIVE locked.
	SQL string
	// Run, when set, is used instead of SQL.
	Run func(ctx context.Context, q Querier) (bool, string, error)
}

// CheckOutcome is the result of one PostCondition.
type CheckOutcome struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Want017 is upstream pgflow 0.17.0's catalog of schema pgflow, the end
// state of the upgrade: internal/versions' one description of 0.17.0
// (shared, read only).
func Want017() (*catalog.Catalog, error) {
	v, err := versions.Lookup(versions.V0_17_0)
	if err != nil {
		return nil, err
	}
	return v.Catalog, nil
}

// functionGone asks whether a function with this signature no longer exists.
func functionGone(signature, why string) string {
	return `select pg_catalog.to_regprocedure('` + signature + `') is null,
	               case when pg_catalog.to_regprocedure('` + signature + `') is null then 'gone' else 'still present: ` + why + `' end`
}

// catalogCheck compares the live pgflow catalog with the 0.17.0
// description (catalog.Diff): every object of the description present and
// defined the same. The pgmq extension's version is not pgflow's; objects
// users add (their own indexes, functions...) are tolerated, as detection
// tolerates them, and named in the detail. A database that has everything
// of 0.17.1+ (upstream's later 0.17.x migrations, applied on top) is
// compared with that description instead, so upstream's own later objects
// (workers.pgflow_version, idx_runs_started_at...) are not called the
// user's.
func catalogCheck(ctx context.Context, q Querier) (bool, string, error) {
	got, err := catalog.Read(ctx, q, versions.Schema)
	if err != nil {
		return false, "", err
	}
	return catalogIs017(got)
}

// catalogIs017 is catalogCheck on a catalog already read.
func catalogIs017(got *catalog.Catalog) (bool, string, error) {
	v, err := versions.Lookup(versions.V0_17_0)
	if err != nil {
		return false, "", err
	}
	if later, err := versions.Lookup(versions.V0_17_1); err != nil {
		return false, "", err
	} else if len(catalog.Missing(later.Catalog, got)) == 0 {
		v = later
	}
	same := "equal to pgflow " + v.Name
	if v.Name != versions.V0_17_0 {
		same += " (0.17.0 with upstream's later 0.17.x migrations)"
	}
	ok, detail := compareCatalog(v.Catalog, got, same)
	return ok, detail, nil
}

// compareCatalog says whether got has every object of want, defined the
// same: the differences when not, else same, with the objects of the
// user's own that got adds named. pgmq's version is not compared.
func compareCatalog(want, got *catalog.Catalog, same string) (bool, string) {
	var bad, extra []string
	for _, d := range catalog.Diff(want, got) {
		switch {
		case d.Kind == catalog.KindPGMQ:
			// pgmq.extension_version: whichever pgmq the database has.
		case d.Change == catalog.ChangeExtra:
			extra = append(extra, d.String())
		default:
			bad = append(bad, d.String())
		}
	}
	if len(bad) > 0 {
		return false, strings.Join(bad, "; ")
	}
	if len(extra) > 0 {
		return true, same + ", plus objects of your own: " + strings.Join(extra, "; ")
	}
	return true, same
}

// PostConditions is the list behind `verify` and apply's post-conditions. Every
// identifier is a constant of this file or of internal/versions (the one
// spelling of each protocol signature); nothing user-supplied is spliced.
func PostConditions() []PostCondition {
	return postConditions(catalogCheck)
}

// postConditions is PostConditions with the catalog comparison given:
// apply's keeps the catalog it reads for the release reached.
func postConditions(catalogRun func(ctx context.Context, q Querier) (bool, string, error)) []PostCondition {
	return []PostCondition{
		{ID: "catalog_0_17_0", Title: "schema pgflow is upstream's 0.17.0 (tables, columns, constraints, indexes, types, functions and their attributes)",
			Run: catalogRun},
		{ID: "old_start_tasks_gone", Title: "0.16.0 " + versions.StartTasks016.String() + " gone: a 0.16.0 worker cannot claim (42883)",
			SQL: functionGone(versions.StartTasks016.String(), "0.16.0 workers can still claim")},
		{ID: "old_ensure_flow_compiled_gone", Title: "0.16.0 " + versions.EnsureFlowCompiled016.String() + " gone (its calls resolve to the 4-argument form)",
			SQL: functionGone(versions.EnsureFlowCompiled016.String(), "two-argument calls are ambiguous")},
		{ID: "old_create_flow_from_shape_gone", Title: "0.16.0 _create_flow_from_shape(text, jsonb) gone",
			SQL: functionGone("pgflow._create_flow_from_shape(text,jsonb)", "0.16.0 compilation path left behind")},
		{ID: "unreleased_start_tasks_gone", Title: "unreleased start_tasks(text, bigint[], uuid, text) gone",
			SQL: functionGone("pgflow.start_tasks(text,bigint[],uuid,text)", "an unreleased claim path")},
		// The review asked for no trigger on the step_tasks hot path.
		{ID: "no_step_tasks_trigger", Title: "no trigger on pgflow.step_tasks (hot path)", SQL: `
			select count(*) = 0, coalesce(string_agg(t.tgname, ', '), 'none')
			  from pg_catalog.pg_trigger t
			 where t.tgrelid = pg_catalog.to_regclass('pgflow.step_tasks') and not t.tgisinternal`},
	}
}

// RunPostConditions runs every post-condition. A check whose query fails is reported as
// failed with the error; only a broken connection or a cancelled context
// (errors the next check would hit too) stops the run.
//
// Inside apply's transaction a failing query would abort the transaction,
// so each check there runs under its own savepoint (inTx).
func RunPostConditions(ctx context.Context, q Querier, inTx bool) ([]CheckOutcome, error) {
	return runPostConditions(ctx, q, inTx, PostConditions())
}

func runPostConditions(ctx context.Context, q Querier, inTx bool, checks []PostCondition) ([]CheckOutcome, error) {
	var out []CheckOutcome
	var answered map[string]CheckOutcome
	if inTx {
		var err error
		if answered, err = sqlChecksAtOnce(ctx, q, checks); err != nil {
			return out, err
		}
	}
	for _, c := range checks {
		if o, ok := answered[c.ID]; ok {
			out = append(out, o)
			continue
		}
		o := CheckOutcome{ID: c.ID, Title: c.Title}
		if inTx {
			if _, err := q.Exec(ctx, "savepoint pgflow_upgrade_check"); err != nil {
				return out, fmt.Errorf("check %s: savepoint: %w", c.ID, err)
			}
		}
		var err error
		if c.Run != nil {
			o.OK, o.Detail, err = c.Run(ctx, q)
		} else {
			err = q.QueryRow(ctx, c.SQL).Scan(&o.OK, &o.Detail)
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("check %s: %w", c.ID, ctx.Err())
			}
			o.OK = false
			o.Detail = "query failed: " + err.Error()
		}
		if inTx {
			stmt := "release savepoint pgflow_upgrade_check"
			if err != nil {
				stmt = "rollback to savepoint pgflow_upgrade_check"
			}
			if _, err := q.Exec(ctx, stmt); err != nil {
				return out, fmt.Errorf("check %s: %s: %w", c.ID, stmt, err)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// sqlChecksAtOnce runs the SQL checks as one statement under one
// savepoint: inside apply's transaction each round trip lengthens the
// time the tables are locked. When that statement fails, nothing is
// answered (the savepoint is rolled back) and each check runs on its own,
// so a failing one is reported with its own error.
func sqlChecksAtOnce(ctx context.Context, q Querier, checks []PostCondition) (map[string]CheckOutcome, error) {
	var sqls []PostCondition
	for _, c := range checks {
		if c.Run == nil {
			sqls = append(sqls, c)
		}
	}
	if len(sqls) < 2 {
		return nil, nil
	}
	from := make([]string, len(sqls))
	dest := make([]any, 0, 2*len(sqls))
	out := make([]CheckOutcome, len(sqls))
	for i, c := range sqls {
		// Each check's SQL is a constant of this package returning one row.
		from[i] = fmt.Sprintf("(%s) as c%d (ok, detail)", strings.TrimSuffix(strings.TrimSpace(c.SQL), ";"), i)
		out[i] = CheckOutcome{ID: c.ID, Title: c.Title}
		dest = append(dest, &out[i].OK, &out[i].Detail)
	}
	// The savepoint, the statement and the release as one pipeline when q
	// can send one (apply's transaction): one round trip.
	b := &pgx.Batch{}
	b.Queue("savepoint pgflow_upgrade_check")
	b.Queue("select * from " + strings.Join(from, " cross join "))
	b.Queue("release savepoint pgflow_upgrade_check")
	var opened bool
	var err error
	if tx, ok := q.(pgx.Tx); ok {
		br := tx.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			opened = true
			if err = br.QueryRow().Scan(dest...); err == nil {
				_, err = br.Exec()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	} else {
		if _, err = q.Exec(ctx, "savepoint pgflow_upgrade_check"); err == nil {
			opened = true
			if err = q.QueryRow(ctx, b.QueuedQueries[1].SQL).Scan(dest...); err == nil {
				_, err = q.Exec(ctx, "release savepoint pgflow_upgrade_check")
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("checks: %w", ctx.Err())
		}
		if !opened {
			return nil, fmt.Errorf("checks: savepoint: %w", err)
		}
		if _, err := q.Exec(ctx, "rollback to savepoint pgflow_upgrade_check"); err != nil {
			return nil, fmt.Errorf("checks: rollback to savepoint pgflow_upgrade_check: %w", err)
		}
		return nil, nil
	}
	answered := make(map[string]CheckOutcome, len(out))
	for _, o := range out {
		answered[o.ID] = o
	}
	return answered, nil
}

// Failed returns the outcomes that did not pass.
func Failed(outcomes []CheckOutcome) []CheckOutcome {
	var bad []CheckOutcome
	for _, o := range outcomes {
		if !o.OK {
			bad = append(bad, o)
		}
	}
	return bad
}
