package upgrade

import (
	"context"

	"github.com/pgflow-upgrade/pgflow-upgrade/audit"
)

// Tables is every pgflow table the upgrade locks, in the documented lock
// order (docs/design.md "Lock order").
var Tables = []string{"flows", "steps", "deps", "runs", "step_states", "step_tasks", "workers"}

// DetectState is audit's schema-state detection (catalog only, no lock on a
// pgflow table), so `audit`, `status` and `apply` always agree on what a
// database is: baseline, upgraded, partial, unknown or not_pgflow.
func DetectState(ctx context.Context, q Querier) (audit.SchemaInfo, error) {
	return audit.DetectSchema(ctx, q)
}
