package catalog

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Kind is the kind of object a Difference is about.
type Kind string

const (
	KindSchema        Kind = "schema"
	KindTable         Kind = "table"
	KindColumn        Kind = "column"
	KindConstraint    Kind = "constraint"
	KindIndex         Kind = "index"
	KindCompositeType Kind = "composite type"
	KindEnum          Kind = "enum"
	KindDomain        Kind = "domain"
	KindFunction      Kind = "function"
	KindTrigger       Kind = "trigger"
	KindSequence      Kind = "sequence"
	KindView          Kind = "view"
	KindPGMQ          Kind = "pgmq"
)

// Change says how an object differs.
type Change string

const (
	ChangeMissing Change = "missing" // wanted, not there
	ChangeExtra   Change = "extra"   // there, not wanted
	ChangeChanged Change = "changed" // there, but Field differs
)

// Difference is one way a catalog differs from the one wanted.
type Difference struct {
	Kind   Kind   `json:"kind"`
	Table  string `json:"table,omitempty"` // columns, constraints, indexes, triggers
	Name   string `json:"name"`            // functions: name(identity arguments)
	Object string `json:"object"`          // how String names it, schema-qualified
	Change Change `json:"change"`
	Field  string `json:"field,omitempty"` // Changed: which attribute
	Want   string `json:"want,omitempty"`
	Got    string `json:"got,omitempty"`
}

// String reads e.g. "function pgflow.start_tasks(text, bigint[], uuid): missing"
// or "index idx_x on pgflow.step_tasks: definition differs: want ..., got ...".
func (d Difference) String() string {
	s := string(d.Kind) + " " + d.Object + ": "
	switch d.Change {
	case ChangeChanged:
		return s + d.Field + " differs: want " + d.Want + ", got " + d.Got
	case ChangeExtra:
		return s + "extra (not in the description)"
	}
	return s + string(d.Change)
}

// Diff lists every way got differs from want; none means equal (column,
// constraint and index order included). The pgmq version is compared too.
func Diff(want, got *Catalog) []Difference {
	return compare(want, got, false)
}

// Missing is the tolerant comparison: what a required object lacks or has
// differently. What users add is ignored — tables, indexes, constraints,
// functions, triggers, sequences, views and types the description does not
// name — and so is the pgmq version. Columns are not: an extra column of a
// required table changes its row type and is named (ChangeExtra).
func Missing(required, got *Catalog) []Difference {
	return compare(required, got, true)
}

// Strings renders differences one per line-item.
func Strings(ds []Difference) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

type differ struct {
	schema   string
	tolerant bool
	shallow  bool // one side has no definitions: compare names only
	out      []Difference
}

// definition compares a definition unless one side was read shallow.
func (r *differ) definition(kind Kind, table, name, object, field, want, got string) {
	if !r.shallow {
		r.changed(kind, table, name, object, field, want, got)
	}
}

func (r *differ) add(d Difference) { r.out = append(r.out, d) }

func (r *differ) changed(kind Kind, table, name, object, field, want, got string) {
	if want != got {
		r.add(Difference{Kind: kind, Table: table, Name: name, Object: object, Change: ChangeChanged, Field: field, Want: want, Got: got})
	}
}

func compare(want, got *Catalog, tolerant bool) []Difference {
	r := &differ{schema: want.Schema, tolerant: tolerant, shallow: want.Shallow || got.Shallow}
	if want.Schema != got.Schema {
		r.changed(KindSchema, "", want.Schema, want.Schema, "name", want.Schema, got.Schema)
	}
	r.tables(want.Tables, got.Tables)
	each(r, KindCompositeType, "", want.CompositeTypes, got.CompositeTypes, func(t CompositeType) string { return t.Name },
		func(w, g CompositeType, obj string) {
			r.changed(KindCompositeType, "", w.Name, obj, "attributes", attrs(w.Attributes), attrs(g.Attributes))
		})
	each(r, KindEnum, "", want.Enums, got.Enums, func(e Enum) string { return e.Name }, func(w, g Enum, obj string) {
		r.changed(KindEnum, "", w.Name, obj, "labels", strings.Join(w.Labels, ", "), strings.Join(g.Labels, ", "))
	})
	each(r, KindDomain, "", want.Domains, got.Domains, func(d Domain) string { return d.Name }, func(w, g Domain, obj string) {
		r.changed(KindDomain, "", w.Name, obj, "type", w.Type, g.Type)
		r.changed(KindDomain, "", w.Name, obj, "not_null", strconv.FormatBool(w.NotNull), strconv.FormatBool(g.NotNull))
		r.changed(KindDomain, "", w.Name, obj, "default", ptr(w.Default), ptr(g.Default))
		var wc, gc []string
		for _, c := range w.Constraints {
			wc = append(wc, c.Name+" "+c.Definition)
		}
		for _, c := range g.Constraints {
			gc = append(gc, c.Name+" "+c.Definition)
		}
		r.changed(KindDomain, "", w.Name, obj, "constraints", strings.Join(wc, "; "), strings.Join(gc, "; "))
	})
	each(r, KindFunction, "", want.Functions, got.Functions, func(f Function) string { return f.Name + "(" + f.IdentityArguments + ")" },
		r.function)
	each(r, KindTrigger, "", want.Triggers, got.Triggers, func(t Trigger) string { return t.Table + "." + t.Name },
		func(w, g Trigger, obj string) {
			r.definition(KindTrigger, w.Table, w.Name, obj, "definition", w.Definition, g.Definition)
		})
	each(r, KindSequence, "", want.Sequences, got.Sequences, func(s Sequence) string { return s.Name }, func(w, g Sequence, obj string) {
		f := func(x Sequence) string {
			return fmt.Sprintf("%s owned by %s identity=%t start %d increment %d min %d max %d cache %d cycle=%t",
				x.Type, x.OwnedBy, x.Identity, x.Start, x.Increment, x.Min, x.Max, x.Cache, x.Cycle)
		}
		r.changed(KindSequence, "", w.Name, obj, "definition", f(w), f(g))
	})
	each(r, KindView, "", want.Views, got.Views, func(v View) string { return v.Name }, func(w, g View, obj string) {
		r.changed(KindView, "", w.Name, obj, "kind", w.Kind, g.Kind)
		r.changed(KindView, "", w.Name, obj, "columns", attrs(w.Columns), attrs(g.Columns))
		r.definition(KindView, "", w.Name, obj, "definition", w.Definition, g.Definition)
	})
	if !tolerant {
		r.changed(KindPGMQ, "", "extension_version", "extension", "extension_version", ptr(want.PGMQ.ExtensionVersion), ptr(got.PGMQ.ExtensionVersion))
	}
	return r.out
}

// each compares two lists keyed by key: missing, extra (exact mode only),
// and same-keyed pairs through same.
func each[T any](r *differ, kind Kind, table string, want, got []T, key func(T) string, same func(w, g T, object string)) {
	byKey := make(map[string]T, len(got))
	for _, g := range got {
		byKey[key(g)] = g
	}
	seen := map[string]bool{}
	for _, w := range want {
		k := key(w)
		seen[k] = true
		obj := r.object(table, w)
		g, ok := byKey[k]
		if !ok {
			r.add(Difference{Kind: kind, Table: tableOf(table, w), Name: nameOf(w), Object: obj, Change: ChangeMissing})
			continue
		}
		same(w, g, obj)
	}
	if r.tolerant {
		return
	}
	for _, g := range got {
		if !seen[key(g)] {
			r.add(Difference{Kind: kind, Table: tableOf(table, g), Name: nameOf(g), Object: r.object(table, g), Change: ChangeExtra})
		}
	}
}

func (r *differ) function(w, g Function, obj string) {
	name := w.Name + "(" + w.IdentityArguments + ")"
	for _, f := range [][3]string{
		{"kind", w.Kind, g.Kind},
		{"arguments", w.Arguments, g.Arguments},
		{"result", w.Result, g.Result},
		{"language", w.Language, g.Language},
		{"volatility", w.Volatility, g.Volatility},
		{"strict", strconv.FormatBool(w.Strict), strconv.FormatBool(g.Strict)},
		{"security_definer", strconv.FormatBool(w.SecurityDefiner), strconv.FormatBool(g.SecurityDefiner)},
		{"leakproof", strconv.FormatBool(w.Leakproof), strconv.FormatBool(g.Leakproof)},
		{"parallel", w.Parallel, g.Parallel},
		{"config", config(w.Config), config(g.Config)},
	} {
		r.changed(KindFunction, "", name, obj, f[0], f[1], f[2])
	}
}

func (r *differ) tables(want, got []Table) {
	each(r, KindTable, "", want, got, func(t Table) string { return t.Name }, func(w, g Table, obj string) {
		r.changed(KindTable, "", w.Name, obj, "kind", w.Kind, g.Kind)
		r.columns(w, g)
		each(r, KindConstraint, w.Name, w.Constraints, g.Constraints, func(c Constraint) string { return c.Name },
			func(wc, gc Constraint, cobj string) {
				r.changed(KindConstraint, w.Name, wc.Name, cobj, "contype", wc.Contype, gc.Contype)
				r.definition(KindConstraint, w.Name, wc.Name, cobj, "definition", wc.Definition, gc.Definition)
			})
		each(r, KindIndex, w.Name, w.Indexes, g.Indexes, func(i Index) string { return i.Name },
			func(wi, gi Index, iobj string) {
				r.definition(KindIndex, w.Name, wi.Name, iobj, "definition", wi.Definition, gi.Definition)
			})
	})
}

// columns: missing, changed, extra (in both modes), and the order of the
// columns both have.
func (r *differ) columns(w, g Table) {
	have := map[string]Column{}
	for _, c := range g.Columns {
		have[c.Name] = c
	}
	wanted := map[string]bool{}
	var wOrder, gOrder []string
	for _, c := range w.Columns {
		wanted[c.Name] = true
		obj := r.schema + "." + w.Name + "." + c.Name
		gc, ok := have[c.Name]
		if !ok {
			r.add(Difference{Kind: KindColumn, Table: w.Name, Name: c.Name, Object: obj, Change: ChangeMissing})
			continue
		}
		wOrder = append(wOrder, c.Name)
		r.changed(KindColumn, w.Name, c.Name, obj, "type", c.Type, gc.Type)
		r.changed(KindColumn, w.Name, c.Name, obj, "not_null", strconv.FormatBool(c.NotNull), strconv.FormatBool(gc.NotNull))
		if c.Generated == "" {
			r.changed(KindColumn, w.Name, c.Name, obj, "default", ptr(c.Default), ptr(gc.Default))
		} else {
			r.definition(KindColumn, w.Name, c.Name, obj, "default", ptr(c.Default), ptr(gc.Default))
		}
		r.changed(KindColumn, w.Name, c.Name, obj, "identity", c.Identity, gc.Identity)
		r.changed(KindColumn, w.Name, c.Name, obj, "generated", c.Generated, gc.Generated)
	}
	for _, c := range g.Columns {
		if wanted[c.Name] {
			gOrder = append(gOrder, c.Name)
			continue
		}
		r.add(Difference{Kind: KindColumn, Table: w.Name, Name: c.Name, Object: r.schema + "." + w.Name + "." + c.Name, Change: ChangeExtra,
			Got: c.Type})
	}
	if !slices.Equal(wOrder, gOrder) {
		r.changed(KindTable, "", w.Name, r.schema+"."+w.Name, "column order", strings.Join(wOrder, ", "), strings.Join(gOrder, ", "))
	}
}

func (r *differ) on(name, table string) string { return name + " on " + r.schema + "." + table }

// object names an object the way String prints it; table is the table a
// constraint or index belongs to.
func (r *differ) object(table string, v any) string {
	switch x := v.(type) {
	case Constraint, Index:
		return r.on(nameOf(x), table)
	case Function:
		return r.schema + "." + x.Name + "(" + TypesOnly(x.IdentityArguments) + ")"
	case Trigger:
		return r.on(x.Name, x.Table)
	case Sequence:
		return x.Name // already qualified
	}
	return r.schema + "." + nameOf(v)
}

func nameOf(v any) string {
	switch x := v.(type) {
	case Table:
		return x.Name
	case Constraint:
		return x.Name
	case Index:
		return x.Name
	case CompositeType:
		return x.Name
	case Enum:
		return x.Name
	case Domain:
		return x.Name
	case Function:
		return x.Name + "(" + x.IdentityArguments + ")"
	case Trigger:
		return x.Name
	case Sequence:
		return x.Name
	case View:
		return x.Name
	}
	return ""
}

func tableOf(table string, v any) string {
	if t, ok := v.(Trigger); ok {
		return t.Table
	}
	return table
}

func attrs(as []Attribute) string {
	var s []string
	for _, a := range as {
		s = append(s, a.Name+" "+a.Type)
	}
	return strings.Join(s, ", ")
}

func ptr(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}

func config(c []string) string {
	if c == nil {
		return "(none)"
	}
	return strings.Join(c, ", ")
}

// multiWordTypes start with a word that could also be an argument name.
var multiWordTypes = []string{
	"timestamp with time zone", "timestamp without time zone", "time with time zone",
	"time without time zone", "double precision", "character varying", "bit varying",
}

// TypesOnly turns identity arguments ("flow_slug text, msg_ids bigint[]")
// into the argument types ("text, bigint[]"), the way a signature is
// usually written. Argument modes and names are dropped.
func TypesOnly(identityArguments string) string {
	if identityArguments == "" {
		return ""
	}
	parts := strings.Split(identityArguments, ", ")
	for i, p := range parts {
		for _, mode := range []string{"IN ", "INOUT ", "VARIADIC "} {
			p = strings.TrimPrefix(p, mode)
		}
		if strings.HasPrefix(p, `"`) { // quoted name
			if end := strings.Index(p[1:], `" `); end >= 0 {
				p = p[end+3:]
			}
		} else if sp := strings.IndexByte(p, ' '); sp > 0 && !isMultiWordType(p) {
			p = p[sp+1:]
		}
		parts[i] = p
	}
	return strings.Join(parts, ", ")
}

func isMultiWordType(s string) bool {
	for _, t := range multiWordTypes {
		first := t[:strings.IndexByte(t, ' ')]
		if strings.HasPrefix(s, t) || strings.HasPrefix(s, first+"(") {
			return true
		}
	}
	return false
}

// MarshalJSON adds the message String prints, so a JSON reader need not
// rebuild it.
func (d Difference) MarshalJSON() ([]byte, error) {
	type plain Difference
	return json.Marshal(struct {
		plain
		Message string `json:"message"`
	}{plain(d), d.String()})
}
