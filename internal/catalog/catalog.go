// Package catalog is the typed form of a pgflow schema's catalog: tables
// (columns in order, constraints, indexes), types, functions with their
// signatures and attributes, triggers, sequences, views and the installed
// pgmq version — definitions only, no bodies, no rows.
//
// The JSON form ("pgflow-catalog/1") is the one the embedded version catalogs
// (internal/versions/catalogs) are written in: Parse reads it, Read produces the same from a live database,
// and Diff / Missing compare two catalogs, exactly or tolerating what users
// add (their own indexes, constraints, functions).
//
// Struct fields are declared in jsonb's key order (shorter keys first, then
// bytewise), so JSON marshalled from a Catalog lists keys as those files do.
package catalog

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Format is the only catalog format this package reads and writes.
const Format = "pgflow-catalog/1"

// Catalog is one schema's catalog.
type Catalog struct {
	PGMQ           PGMQ            `json:"pgmq"`
	Enums          []Enum          `json:"enums"`
	Views          []View          `json:"views"`
	Format         string          `json:"format"`
	Schema         string          `json:"schema"`
	Tables         []Table         `json:"tables"`
	Domains        []Domain        `json:"domains"`
	Triggers       []Trigger       `json:"triggers"`
	Functions      []Function      `json:"functions"`
	Sequences      []Sequence      `json:"sequences"`
	CompositeTypes []CompositeType `json:"composite_types"`

	// Shallow: read by ReadShallow, without definitions (not in JSON).
	Shallow bool `json:"-"`
}

// PGMQ is the installed pgmq extension's version (nil: not an extension,
// e.g. absent or installed from SQL).
type PGMQ struct {
	ExtensionVersion *string `json:"extension_version"`
}

// Table is an ordinary or partitioned table.
type Table struct {
	Kind        string       `json:"kind"` // "table" or "partitioned table"
	Name        string       `json:"name"`
	Columns     []Column     `json:"columns"` // attnum order
	Indexes     []Index      `json:"indexes"`
	Constraints []Constraint `json:"constraints"`
}

// Column is one column as format_type and pg_get_expr print it.
type Column struct {
	Name      string  `json:"name"`
	Type      string  `json:"type"`
	Default   *string `json:"default"`
	Identity  string  `json:"identity,omitempty"` // "always", "by default" or ""
	NotNull   bool    `json:"not_null"`
	Generated string  `json:"generated,omitempty"` // "stored" or ""
}

// Constraint is one table constraint as pg_get_constraintdef prints it.
type Constraint struct {
	Name       string `json:"name"`
	Contype    string `json:"contype"` // c f p u x t
	Definition string `json:"definition"`
}

// Index is one index as pg_get_indexdef prints it.
type Index struct {
	Name       string `json:"name"`
	Definition string `json:"definition"`
}

// CompositeType is a stand-alone composite type.
type CompositeType struct {
	Name       string      `json:"name"`
	Attributes []Attribute `json:"attributes"`
}

// Attribute is one attribute of a composite type or a view column.
type Attribute struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Enum is an enum type with its labels in sort order.
type Enum struct {
	Name   string   `json:"name"`
	Labels []string `json:"labels"`
}

// Domain is a domain type.
type Domain struct {
	Name        string             `json:"name"`
	Type        string             `json:"type"`
	Default     *string            `json:"default"`
	NotNull     bool               `json:"not_null"`
	Constraints []DomainConstraint `json:"constraints"`
}

// DomainConstraint is one check of a domain.
type DomainConstraint struct {
	Name       string `json:"name"`
	Definition string `json:"definition"`
}

// Function is one function (or procedure) by signature and attributes.
type Function struct {
	Kind              string   `json:"kind"` // function, procedure, aggregate, window
	Name              string   `json:"name"`
	Config            []string `json:"config"` // proconfig entries, sorted; nil when none
	Result            string   `json:"result"`
	Strict            bool     `json:"strict"`
	Language          string   `json:"language"`
	Parallel          string   `json:"parallel"`  // safe, restricted, unsafe
	Arguments         string   `json:"arguments"` // with defaults
	Leakproof         bool     `json:"leakproof"`
	Volatility        string   `json:"volatility"` // immutable, stable, volatile
	SecurityDefiner   bool     `json:"security_definer"`
	IdentityArguments string   `json:"identity_arguments"`
}

// Trigger is one user trigger.
type Trigger struct {
	Name       string `json:"name"`
	Table      string `json:"table"`
	Definition string `json:"definition"`
}

// Sequence is a sequence owned by (or the identity of) a column of the schema.
type Sequence struct {
	Max       int64  `json:"max"`
	Min       int64  `json:"min"`
	Name      string `json:"name"` // schema-qualified
	Type      string `json:"type"`
	Cache     int64  `json:"cache"`
	Cycle     bool   `json:"cycle"`
	Start     int64  `json:"start"`
	Identity  bool   `json:"identity"`
	OwnedBy   string `json:"owned_by"` // table.column
	Increment int64  `json:"increment"`
}

// View is a view or materialized view.
type View struct {
	Kind       string      `json:"kind"` // "view" or "materialized view"
	Name       string      `json:"name"`
	Columns    []Attribute `json:"columns"`
	Definition string      `json:"definition"`
}

// Parse reads a catalog in its JSON form. Unknown keys are an error: a
// newer format must not be half-read.
func Parse(data []byte) (*Catalog, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Catalog
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("parsing a pgflow catalog (JSON %q): %w", Format, err)
	}
	if c.Format != Format {
		return nil, fmt.Errorf("parsing a pgflow catalog: format %q, want %q", c.Format, Format)
	}
	return &c, nil
}

// JSON is the catalog in its JSON form, indented, without HTML escaping
// (definitions hold <, > and &).
func (c *Catalog) JSON() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "    ")
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("encoding a pgflow catalog: %w", err)
	}
	return buf.Bytes(), nil
}

// Clone is a deep copy (through the JSON form), so derived descriptions
// never share slices with the catalog they came from.
func (c *Catalog) Clone() *Catalog {
	b, err := json.Marshal(c)
	if err != nil {
		panic(fmt.Sprintf("catalog: cloning: %v", err)) // only plain data: cannot fail
	}
	var out Catalog
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("catalog: cloning: %v", err))
	}
	return &out
}

// Table returns the table called name, or nil.
func (c *Catalog) Table(name string) *Table {
	for i := range c.Tables {
		if c.Tables[i].Name == name {
			return &c.Tables[i]
		}
	}
	return nil
}

// Function returns the function name(identityArguments), or nil.
func (c *Catalog) Function(name, identityArguments string) *Function {
	for i := range c.Functions {
		if c.Functions[i].Name == name && c.Functions[i].IdentityArguments == identityArguments {
			return &c.Functions[i]
		}
	}
	return nil
}

// Column returns the column called name, or nil.
func (t *Table) Column(name string) *Column {
	for i := range t.Columns {
		if t.Columns[i].Name == name {
			return &t.Columns[i]
		}
	}
	return nil
}

// Constraint returns the constraint called name, or nil.
func (t *Table) Constraint(name string) *Constraint {
	for i := range t.Constraints {
		if t.Constraints[i].Name == name {
			return &t.Constraints[i]
		}
	}
	return nil
}

// Index returns the index called name, or nil.
func (t *Table) Index(name string) *Index {
	for i := range t.Indexes {
		if t.Indexes[i].Name == name {
			return &t.Indexes[i]
		}
	}
	return nil
}
