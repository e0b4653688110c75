package scenario

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// UpgradeFunc runs the upgrade on db. An error means it refused (or failed);
// the database must then be unchanged. The result may be nil.
type UpgradeFunc func(ctx context.Context, db *DB) (*upgrade.Result[*upgrade.Report], error)

// Apply is the real upgrade: `pgflow-upgrade apply` (internal/upgrade.Apply:
// advisory lock, ordered table locks with retries, preflight under the
// locks, the migration, post-conditions, one transaction).
func Apply(ctx context.Context, db *DB) (*upgrade.Result[*upgrade.Report], error) {
	return ApplyWith(ctx, db, upgrade.Options{})
}

// ApplyWith is Apply with options (zero values: 10 s advisory wait, 2 s lock
// timeout, 5 lock retries).
func ApplyWith(ctx context.Context, db *DB, opts upgrade.Options) (*upgrade.Result[*upgrade.Report], error) {
	if opts.Wait == 0 {
		opts.Wait = 10 * time.Second
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = 2 * time.Second
	}
	if opts.LockRetries == 0 {
		opts.LockRetries = 5
	}
	// As the CLI's apply session: pinned.
	conn, err := session.OpenWith(ctx, db.DSN, session.Options{Purpose: session.Rehearsal, Name: "pgflow-upgrade apply (replay)"})
	if errors.Is(err, session.ErrMalformed) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("apply: connecting to %s: %w", db.Name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rep, err := upgrade.Apply(ctx, conn, opts)
	if err != nil {
		return rep, fmt.Errorf("apply (%s): %w", rep.Outcome, err)
	}
	if err := rep.Want(upgrade.OutcomeApplied); err != nil {
		return rep, fmt.Errorf("apply: %w", err)
	}
	return rep, nil
}
