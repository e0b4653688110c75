package online

import (
	"context"
	"fmt"
)

// cancelAutovacuum cancels an autovacuum worker that holds a lock on a
// pgflow table, just before a step that needs ACCESS EXCLUSIVE there (the
// checks NOT VALID, the switch). After the backfill, step_tasks is due a
// vacuum (a new version of every row), and its autovacuum holds SHARE UPDATE
// EXCLUSIVE for minutes; PostgreSQL itself cancels it for a waiting
// ACCESS EXCLUSIVE, but only after deadlock_timeout (1 s), far beyond our
// lock_timeout, so every attempt would wait its full lock_timeout in the
// lock queue with the application queued behind it, and give up. A cancelled
// autovacuum starts again later (nothing is lost). Anti-wraparound
// autovacuums are left alone, as PostgreSQL leaves them; so is every worker
// when the role may not signal it (then the bounded retries go on).
func (e *engine) cancelAutovacuum(ctx context.Context) {
	var n int
	err := e.conn.QueryRow(ctx, `
		select pg_catalog.count(*) filter (where pg_catalog.pg_cancel_backend(a.pid))::int
		from pg_catalog.pg_stat_activity a
		where a.backend_type = 'autovacuum worker'
		  and a.query not like '%to prevent wraparound%'
		  and exists (select 1 from pg_catalog.pg_locks l join pg_catalog.pg_class c on c.oid = l.relation
		              where l.pid = a.pid and l.granted
		                and c.relnamespace = pg_catalog.to_regnamespace('pgflow'))`).Scan(&n)
	if err != nil {
		// Not allowed to signal it (a role without pg_signal_backend, or a
		// superuser-owned worker): the bounded retries wait it out.
		e.event(Event{Phase: PhaseNone, Detail: fmt.Sprintf("could not cancel autovacuum on pgflow tables (%v); the lock attempts retry", shortErr(err))})
		return
	}
	if n > 0 {
		e.event(Event{Phase: PhaseNone, Detail: fmt.Sprintf("cancelled %d autovacuum worker(s) holding a pgflow table (it starts again later)", n)})
	}
}
