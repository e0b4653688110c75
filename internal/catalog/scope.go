package catalog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Scope names some objects of a schema: tables (with their columns,
// constraints, indexes, triggers and owned sequences) and functions (every
// overload of each name). A read of a scope costs what its objects cost,
// not the whole schema's: it is the read a transaction can afford while it
// holds the application's tables locked.
type Scope struct {
	Tables    []string
	Functions []string
}

// Empty: the scope names nothing.
func (s Scope) Empty() bool { return len(s.Tables) == 0 && len(s.Functions) == 0 }

// Len counts the names of the scope.
func (s Scope) Len() int { return len(s.Tables) + len(s.Functions) }

// ScopeOf is the scope that holds every object of ds. ok is false when a
// difference is about an object a scope cannot name (a type, an enum, a
// domain, a view, the schema itself): only a whole read covers it. The
// pgmq version is no object of the schema and is left out.
func ScopeOf(ds []Difference) (s Scope, ok bool) {
	for _, d := range ds {
		switch d.Kind {
		case KindTable:
			s.Tables = append(s.Tables, d.Name)
		case KindColumn, KindConstraint, KindIndex, KindTrigger:
			s.Tables = append(s.Tables, d.Table)
		case KindFunction:
			name, _, _ := strings.Cut(d.Name, "(")
			s.Functions = append(s.Functions, name)
		case KindPGMQ:
		default:
			return Scope{}, false
		}
	}
	slices.Sort(s.Tables)
	slices.Sort(s.Functions)
	return Scope{Tables: slices.Compact(s.Tables), Functions: slices.Compact(s.Functions)}, true
}

// ReadScope is Read of the objects of s only (one catalog query, the same
// texts as Read's): tables, their triggers and sequences, and functions;
// no types or views.
func ReadScope(ctx context.Context, q Querier, schema string, s Scope) (*Catalog, error) {
	// Never NULL: an empty list matches nothing.
	tables, functions := append([]string{}, s.Tables...), append([]string{}, s.Functions...)
	return query(ctx, q, schema, scopeSQL, tables, functions)
}

// Restrict is c with only the objects of s, as ReadScope reads them (for
// comparing a scoped read with a description). c is not changed.
func (c *Catalog) Restrict(s Scope) *Catalog {
	out := c.Clone()
	out.Tables = slices.DeleteFunc(out.Tables, func(t Table) bool { return !slices.Contains(s.Tables, t.Name) })
	out.Triggers = slices.DeleteFunc(out.Triggers, func(t Trigger) bool { return !slices.Contains(s.Tables, t.Table) })
	out.Sequences = slices.DeleteFunc(out.Sequences, func(q Sequence) bool {
		table, _, _ := strings.Cut(q.OwnedBy, ".")
		return !slices.Contains(s.Tables, table)
	})
	out.Functions = slices.DeleteFunc(out.Functions, func(f Function) bool { return !slices.Contains(s.Functions, f.Name) })
	out.CompositeTypes, out.Enums, out.Domains, out.Views = nil, nil, nil, nil
	return out
}

// PreparedScope is ReadScope's query prepared in a transaction ahead of
// the read that counts: a prepared statement on its generic plan, planned
// once by a first read (the catalog query takes milliseconds to plan, more
// on a busy server), so that a later read in the same transaction only
// runs it. Close it in the same transaction: a prepared statement belongs
// to the server session, which a transaction pooler hands on, and it
// outlives a rollback.
type PreparedScope struct {
	name, schema string
	scope        Scope
}

// preparedScopeName names the prepared statement (one at a time).
const preparedScopeName = "pgflow_upgrade_catalog_scope"

// PrepareScope prepares the read of s in tx and plans it by reading it
// once. ok is false (nothing prepared) where prepared statements do not
// reach the server (the simple protocol a pooler may ask for): ReadScope
// then.
func PrepareScope(ctx context.Context, tx pgx.Tx, schema string, s Scope) (p *PreparedScope, ok bool, err error) {
	conn := tx.Conn()
	if conn.Config().DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		return nil, false, nil
	}
	if _, err := conn.Prepare(ctx, preparedScopeName, scopeSQL); err != nil {
		return nil, false, fmt.Errorf("preparing the catalog read of schema %s: %w", schema, err)
	}
	p = &PreparedScope{name: preparedScopeName, schema: schema, scope: s}
	if _, err := p.Read(ctx, tx); err != nil {
		return nil, false, joinClose(err, p.Close(ctx, conn))
	}
	return p, true, nil
}

// Read is ReadScope on the prepared statement's generic plan.
func (p *PreparedScope) Read(ctx context.Context, tx pgx.Tx) (*Catalog, error) {
	tables, functions := append([]string{}, p.scope.Tables...), append([]string{}, p.scope.Functions...)
	return queryInTxPlan(ctx, tx, true, p.schema, p.name, tables, functions)
}

// Close deallocates the prepared statement (in or out of a transaction:
// a prepared statement outlives a rollback).
func (p *PreparedScope) Close(ctx context.Context, conn *pgx.Conn) error {
	if err := conn.Deallocate(ctx, p.name); err != nil {
		return fmt.Errorf("deallocating the prepared catalog read: %w", err)
	}
	return nil
}

func joinClose(err, closeErr error) error {
	if closeErr == nil {
		return err
	}
	return fmt.Errorf("%w (and %w)", err, closeErr)
}
