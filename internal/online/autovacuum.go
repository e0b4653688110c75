package online

import (
	"context"
	"fmt"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// cancelAutovacuum cancels an autovacuum worker that holds a lock on a
// pgflow table, just before a step that needs a strong lock there (the
// checks NOT VALID, the switch): the same upgrade.CancelAutovacuum the
// transactional apply runs before each of its lock attempts, where the
// reasons are given. After the backfill step_tasks is due a vacuum (a new
// version of every row), so its autovacuum is the usual one in the way.
// When the role may not cancel it, the bounded retries go on.
func (e *engine) cancelAutovacuum(ctx context.Context) {
	n, err := upgrade.CancelAutovacuum(ctx, e.conn)
	if err != nil {
		e.event(Event{Phase: PhaseNone, Detail: upgrade.AutovacuumNote(err) + "; the lock attempts retry"})
		return
	}
	if n > 0 {
		e.event(Event{Phase: PhaseNone, Detail: fmt.Sprintf("cancelled %d autovacuum worker(s) holding a pgflow table (it starts again later)", n)})
	}
}
