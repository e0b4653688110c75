package versions

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"ariga.io/atlas/sql/migrate"
)

// Upstream's releases as data. Upstream's history is one line of migration
// files; a release is exactly the files its atlas.sum lists, a prefix of
// that line. upstream/pgflow.atlas.sum is the newest release's atlas.sum:
// its hash lines only (Atlas's chained h1 hash of each file, facts that
// identify the bytes), never the files.

//go:embed upstream/pgflow.atlas.sum
var upstreamSum []byte

// Release names.
const (
	R0_14_1            = "0.14.1"
	R0_15_0            = "0.15.0"
	R0_15_1            = "0.15.1"
	R0_16_0            = "0.16.0"
	R0_17_0            = "0.17.0"
	R0_17_1            = "0.17.1"
	R0_17_1EndpointFix = "0.17.1-endpoint-fix"
	// Newest is upstream's newest release: where a plan goes by default.
	Newest = R0_17_1EndpointFix
)

// Release is one of upstream's releases: its first Files files.
type Release struct {
	Name  string
	Files int
	// Shipped: its atlas.sum is known as upstream shipped it (the 0.15.x
	// releases are prefixes whose atlas.sum is not vendored).
	Shipped bool
}

// Releases are upstream's releases, oldest first.
var Releases = []Release{
	{R0_14_1, 20, true},
	{R0_15_0, 21, false},
	{R0_15_1, 22, false},
	{R0_16_0, 23, true},
	{R0_17_0, 24, true},
	{R0_17_1, 26, true},
	{R0_17_1EndpointFix, 27, true},
}

// LookupRelease returns the release called name.
func LookupRelease(name string) (Release, error) {
	var names []string
	for _, r := range Releases {
		if r.Name == name {
			return r, nil
		}
		names = append(names, r.Name)
	}
	return Release{}, fmt.Errorf("pgflow release %q: not one this tool knows (%s)", name, strings.Join(names, ", "))
}

// UpstreamFile is one of upstream's migration files, as its atlas.sum line
// names it.
type UpstreamFile struct {
	Index int    // 1-based position in upstream's history
	Name  string // <14-digit version>_<name>.sql, as upstream names it
	Hash  string // Atlas's h1 hash (base64), chained over every file before it
}

// Version is the file's 14-digit prefix, the Supabase ledger's key.
func (f UpstreamFile) Version() string { v, _, _ := strings.Cut(f.Name, "_"); return v }

// Title is the file's name without version and extension: the ledger's name.
func (f UpstreamFile) Title() string {
	_, n, _ := strings.Cut(strings.TrimSuffix(f.Name, ".sql"), "_")
	return n
}

var (
	upstreamOnce  sync.Once
	upstreamFiles []UpstreamFile
)

// UpstreamFiles is upstream's history, oldest first. It panics if the
// embedded atlas.sum does not parse or its checksum is wrong (a build
// defect, caught by the package's tests).
func UpstreamFiles() []UpstreamFile {
	upstreamOnce.Do(func() {
		var sum migrate.HashFile
		if err := sum.UnmarshalText(upstreamSum); err != nil {
			panic(fmt.Sprintf("versions: embedded upstream/pgflow.atlas.sum: %v", err))
		}
		for i, l := range sum {
			upstreamFiles = append(upstreamFiles, UpstreamFile{Index: i + 1, Name: l.N, Hash: l.H})
		}
	})
	return upstreamFiles
}

// StateName names the state of a database holding upstream's first n
// files: a release's name, "0.17.1 without the endpoint fix" for 0.17.1
// (whose patch release exists), else where it lies between releases.
func StateName(n int) string {
	switch {
	case n == 0:
		return "no pgflow"
	case n == 26:
		return "0.17.1 without the endpoint fix"
	}
	var before *Release
	for i := range Releases {
		r := &Releases[i]
		if r.Files == n {
			return r.Name
		}
		if r.Files < n {
			before = r
		}
	}
	if before == nil {
		return fmt.Sprintf("upstream's first %d files (before %s)", n, R0_14_1)
	}
	return fmt.Sprintf("upstream's first %d files (after %s)", n, before.Name)
}

// fileNotes: what upstream's files do beyond replacing functions, for the
// plan and the audit (docs/releases.md has the full lock table).
var fileNotes = map[int][]string{
	21: {"adds worker_functions' start_mode CHECK (a scan of worker_functions, small)"},
	22: {"replaces step_tasks' valid_status CHECK (upstream: ACCESS EXCLUSIVE on step_tasks and a full scan; apply validates it beforehand)",
		"updates the step_tasks rows of skipped steps and failed runs still queued or started (a join over those tasks)"},
	25: {"replaces _assert_step_queue_available (an owned route's missing pgmq queue is refused from now on) and _cascade_force_skip_steps (a force-skip cascade archives every step queue's messages)"},
	26: {"adds workers.pgflow_version and indexes idx_runs_started_at, idx_workers_started_at, idx_workers_stopped_at (upstream: plain CREATE INDEX, writes to runs blocked for the build; apply builds them CONCURRENTLY beforehand)",
		"creates schema pgflow_telemetry and schedules pg_cron job pgflow_telemetry_report (daily: it posts pgflow_telemetry.preview()'s anonymous counts through pg_net; apply --telemetry off opts out with pgflow_telemetry.disable())"},
	27: {"replaces pgflow_telemetry.report() (posts to a host that resolves); opted-out databases stay opted out"},
}

// FileNotes says what upstream's file n does beyond replacing functions.
func FileNotes(n int) []string { return fileNotes[n] }
