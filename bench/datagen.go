// Package bench holds the benchmarks of `make bench` (see BENCHMARKS.md); the
// data generator they use is internal/datagen.
package bench

import "github.com/pgflow-upgrade/pgflow-upgrade/internal/datagen"

// The data generator lives in internal/datagen (the audit's forecast
// sample uses it too); these names keep the benchmarks' spelling.
type (
	// DB is a connection, pool or transaction.
	DB = datagen.DB
	// Shape says how much data Generate makes.
	Shape = datagen.Shape
)

var (
	// Generate fills a database that holds the empty 0.16.0 baseline.
	Generate = datagen.Generate
	// FlowSlug names the i-th generated flow.
	FlowSlug = datagen.FlowSlug
)
