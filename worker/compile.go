package worker

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/versions"
)

// Compile statuses reported by ensure_flow_compiled.
const (
	StatusCompiled   = "compiled"   // the flow was created (with its queues)
	StatusVerified   = "verified"   // it existed with the same shape and routing
	StatusRecompiled = "recompiled" // it differed and was rebuilt (a local database only)
	StatusMismatch   = "mismatch"   // it differs (see MismatchKind)
)

// Mismatch kinds of a StatusMismatch result.
const (
	MismatchShape   = "shape"
	MismatchRouting = "routing"
)

// CompileResult is what ensure_flow_compiled returned.
type CompileResult struct {
	Status       string   `json:"status"`
	Differences  []string `json:"differences"`
	MismatchKind string   `json:"mismatchKind,omitempty"`
}

// ensureFlowSignature is the call a 0.16.0 database cannot resolve
// (internal/versions' one spelling of the 0.17 signatures).
var ensureFlowSignature = versions.EnsureFlowCompiled017.String()

// EnsureFlow resolves the flow's routes locally and calls
// pgflow.ensure_flow_compiled(slug, shape, queue_mode, route_map) with four
// positional arguments, as upstream's worker does at startup. The database
// creates a missing flow (and its queues), verifies an existing one, or
// reports a mismatch: a *FlowRoutingMismatchError when only the routing
// differs, a *FlowShapeMismatchError otherwise. On a database without the
// 0.17 function (pgflow 0.16.0) it returns a *ProtocolMismatchError.
func EnsureFlow(ctx context.Context, db Querier, f Flow) (CompileResult, error) {
	shape, err := f.Shape()
	if err != nil {
		return CompileResult{}, err
	}
	routes, err := f.Routes()
	if err != nil {
		return CompileResult{}, err
	}
	routeMap, err := json.Marshal(routes)
	if err != nil {
		return CompileResult{}, fmt.Errorf("encoding the route map of flow %q: %w", f.Slug, err)
	}
	var raw []byte
	err = db.QueryRow(ctx, `select pgflow.ensure_flow_compiled($1::text, $2::jsonb, $3::text, $4::jsonb)`,
		f.Slug, string(shape), string(f.mode()), string(routeMap)).Scan(&raw)
	if err != nil {
		if isUndefined(err) {
			return CompileResult{}, &ProtocolMismatchError{Missing: []string{ensureFlowSignature}, Err: err}
		}
		return CompileResult{}, fmt.Errorf("compiling flow %q (queue mode %s): %w", f.Slug, f.mode(), err)
	}
	var res CompileResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return CompileResult{}, fmt.Errorf("compiling flow %q: unexpected result %s: %w", f.Slug, raw, err)
	}
	switch res.Status {
	case StatusCompiled, StatusVerified, StatusRecompiled:
		return res, nil
	case StatusMismatch:
		if res.MismatchKind == MismatchRouting {
			return res, &FlowRoutingMismatchError{FlowSlug: f.Slug, Differences: res.Differences}
		}
		return res, &FlowShapeMismatchError{FlowSlug: f.Slug, Differences: res.Differences}
	}
	return res, fmt.Errorf("compiling flow %q: unknown status %q", f.Slug, res.Status)
}

// protocolFunctions are the pgflow functions the worker calls, as
// regprocedure signatures.
var protocolFunctions = []string{
	versions.EnsureFlowCompiled017.String(),
	versions.TrackWorkerFunction015.String(),
	versions.StartTasks017.String(),
	"pgflow.complete_task(uuid,text,integer,jsonb)",
	"pgflow.fail_task(uuid,text,integer,text)",
	"pgflow.mark_worker_stopped(uuid)",
}

// CheckProtocol only reads: it returns a *ProtocolMismatchError listing the
// functions of the 0.17 worker protocol the database lacks, or nil. Start
// does not call it (the worker's first call, ensure_flow_compiled, fails
// the same way on a 0.16.0 database); it is for tools that check a
// database before any worker runs.
func CheckProtocol(ctx context.Context, db Querier) error {
	rows, err := db.Query(ctx,
		`select f from pg_catalog.unnest($1::text[]) with ordinality as u(f, i)
		 where pg_catalog.to_regprocedure(f) is null order by i`, protocolFunctions)
	if err != nil {
		if isUndefined(err) {
			return &ProtocolMismatchError{Missing: protocolFunctions, Err: err}
		}
		return fmt.Errorf("checking the pgflow worker protocol functions: %w", err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		if isUndefined(err) {
			return &ProtocolMismatchError{Missing: protocolFunctions, Err: err}
		}
		return fmt.Errorf("checking the pgflow worker protocol functions: %w", err)
	}
	if len(missing) > 0 {
		return &ProtocolMismatchError{Missing: missing}
	}
	return nil
}
