package versions

import (
	"fmt"
	"strings"
)

// Upstream's releases as data. Upstream's history is one line of migration
// files; a release is exactly the files its atlas.sum lists, a prefix of
// that line, recorded below by name and hash (upstreamHistory).

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

// UpstreamFiles is upstream's history, oldest first. Shared: read only.
func UpstreamFiles() []UpstreamFile { return upstreamHistory }

// upstreamHistory is upstream's history as the newest release's atlas.sum
// lists it: each file's name and Atlas's chained h1 hash, facts that
// identify the bytes (never the files themselves).
var upstreamHistory = []UpstreamFile{
	{1, "20250429164909_pgflow_initial.sql", "I3n/tQIg5Q5nLg7RDoU3BzqHvFVjmumQxVNbXTPG15s="},
	{2, "20250517072017_pgflow_fix_poll_for_tasks_to_use_separate_statement_for_polling.sql", "wTuXuwMxVniCr3ONCpodpVWJcHktoQZIbqMZ3sUHKMY="},
	{3, "20250609105135_pgflow_add_start_tasks_and_started_status.sql", "ggGanW4Wyt8Kv6TWjnZ00/qVb3sm+/eFVDjGfT8qyPg="},
	{4, "20250610180554_pgflow_add_set_vt_batch_and_use_it_in_start_tasks.sql", "Mpf0PImrTsaZaIEPTQpONi5Ad0/RNfnatfc1WglG360="},
	{5, "20250614124241_pgflow_add_realtime.sql", "jhMIt4OkrPf9o4hqcBZWBxxaQk94l252XRwjpEr51aA="},
	{6, "20250619195327_pgflow_fix_fail_task_missing_realtime_event.sql", "n9kZFdfkYWaLCKvOHOSbJl6PFUhOiocdPVBcqyA4Ew4="},
	{7, "20250627090700_pgflow_fix_function_search_paths.sql", "AEqyLIzjuInSmGrUwKhw5jv6S1iY3yaiKNKaLWjGbys="},
	{8, "20250707210212_pgflow_add_opt_start_delay.sql", "MGzPX/E9NCr0w4LZR/Iw1vRxo/Gp+WpPO01r7giDulY="},
	{9, "20250719205006_pgflow_worker_deprecation.sql", "pL5cR1/Oag993yWN6sUpE/U3LmVSzAlnoRXJRBtErU8="},
	{10, "20251006073122_pgflow_add_map_step_type.sql", "D/skgKpaVg5TM8bPovo9FUutQfg35/AzkxEcasYwytY="},
	{11, "20251103222045_pgflow_fix_broadcast_order_and_timestamp_handling.sql", "K/XnZpOmxfelsaNoJbR5HxhBrs/oW4aYja222h5cps4="},
	{12, "20251104080523_pgflow_upgrade_pgmq_1_5_1.sql", "Fw7zpMWnjhAHQ0qBJAprAvGl7dJMd8ExNHg8aKvkzTg="},
	{13, "20251130000000_pgflow_auto_compilation.sql", "qs+3qq1Vsyo0ETzbxDnmkVtSUa6XHkd/K9wF/3W46jM="},
	{14, "20251209074533_pgflow_worker_management.sql", "ozFkYM1EvEH7dGvW+1pWgpzbwdWlwuQoddqLomL1GXw="},
	{15, "20251212100113_pgflow_allow_data_loss_parameter.sql", "Fg3RHj51STNHS4epQ2J4AFMj7NwG0XfyDTSA/9dcBIQ="},
	{16, "20251225163110_pgflow_add_flow_input_column.sql", "734uCbTgKmPhTK3TY56uNYZ31T8u59yll9ea7nwtEoc="},
	{17, "20260103145141_pgflow_step_output_storage.sql", "mgVHSFDLdtYy//SZ6C03j9Str1iS9xCM8Rz/wyFwn3o="},
	{18, "20260120205547_pgflow_requeue_stalled_tasks.sql", "4wCBBvjtETCgJf1eXmlH5wCTKDUhiLi0uzsFG1V528E="},
	{19, "20260124113408_pgflow_auth_secret_support.sql", "i/s1JkBqRElN6FOYFQviJt685W08SuSo30aP25lNlLc="},
	{20, "20260214181656_pgflow_step_conditions.sql", "rHQnXCeZ/QGxPlChdTMxumtsTtYHr1ej183Dd+auw34="},
	{21, "20260607175525_pgflow_worker_start_mode.sql", "PFAfoGaHe5stKF7YAFg6AqBxmRisqDvV60vVpnnVdBE="},
	{22, "20260904095427_pgflow_task_lifecycle_hardening.sql", "27b0BfBcQxeu5XSqVtQYvDCRzTsvLqzS/5hx14/2VyM="},
	{23, "20260907082520_pgflow_remove_legacy_flow_compilation.sql", "LNFDz+ZZlWb19FmWNPK57eiD+FXySMbStVij8MTSvDw="},
	{24, "20260915074120_pgflow_private_step_queues.sql", "+vsfsOyDaM8WISO/jxp4UBlTzPuQhg6RwBCiOAk5YAE="},
	{25, "20260919152659_pgflow_fix_force_skip_multi_queue.sql", "DC7uQRwjpOm3A4NtDYb3SjbSSqQix4MlQ4+BnhGQ/Q8="},
	{26, "20260920093533_pgflow_telemetry.sql", "dp3gNRSUpTNoPH9w4n9P7CBhXFoJspQ+hP9MfQ1u3Fg="},
	{27, "20261001194538_pgflow_telemetry_endpoint_fix.sql", "/ROJiUnHzOt6xsw9f877wY6KlrVOFxpjGBuFuweX6Is="},
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
