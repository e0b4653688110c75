package versions

// Migration is one of upstream's Supabase migration files.
type Migration struct {
	Version string `json:"version"` // the 14-digit prefix, the ledger's key
	Name    string `json:"name"`
}

// File is the migration's file name.
func (m Migration) File() string { return m.Version + "_" + m.Name + ".sql" }

// ledger is upstream's migrations in order (1-23 up to 0.16.0, 24-26 in
// 0.17.x). A version consists of a prefix.
var ledger = []Migration{
	{"20250429164909", "pgflow_initial"},
	{"20250517072017", "pgflow_fix_poll_for_tasks_to_use_separate_statement_for_polling"},
	{"20250609105135", "pgflow_add_start_tasks_and_started_status"},
	{"20250610180554", "pgflow_add_set_vt_batch_and_use_it_in_start_tasks"},
	{"20250614124241", "pgflow_add_realtime"},
	{"20250619195327", "pgflow_fix_fail_task_missing_realtime_event"},
	{"20250627090700", "pgflow_fix_function_search_paths"},
	{"20250707210212", "pgflow_add_opt_start_delay"},
	{"20250719205006", "pgflow_worker_deprecation"},
	{"20251006073122", "pgflow_add_map_step_type"},
	{"20251103222045", "pgflow_fix_broadcast_order_and_timestamp_handling"},
	{"20251104080523", "pgflow_upgrade_pgmq_1_5_1"},
	{"20251130000000", "pgflow_auto_compilation"},
	{"20251209074533", "pgflow_worker_management"},
	{"20251212100113", "pgflow_allow_data_loss_parameter"},
	{"20251225163110", "pgflow_add_flow_input_column"},
	{"20260103145141", "pgflow_step_output_storage"},
	{"20260120205547", "pgflow_requeue_stalled_tasks"},
	{"20260124113408", "pgflow_auth_secret_support"},
	{"20260214181656", "pgflow_step_conditions"},                // 20: 0.14.1
	{"20260607175525", "pgflow_worker_start_mode"},              // 21: 0.15.0
	{"20260904095427", "pgflow_task_lifecycle_hardening"},       // 22: 0.15.1
	{"20260907082520", "pgflow_remove_legacy_flow_compilation"}, // 23: 0.16.0
	{"20260915074120", "pgflow_private_step_queues"},            // 24: 0.17.0
	{"20260919152659", "pgflow_fix_force_skip_multi_queue"},
	{"20260920093533", "pgflow_telemetry"}, // 26: 0.17.1
}

// migrationsUpTo is a copy of the first n ledger entries.
func migrationsUpTo(n int) []Migration {
	return append([]Migration(nil), ledger[:n]...)
}
