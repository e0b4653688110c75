// Package bench holds the benchmarks of `make bench` (see BENCHMARKS.md); the
// data generator they use is internal/datagen.
package bench
