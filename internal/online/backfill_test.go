package online_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// A run stopped before its third batch has swept exactly blocks 0 and 1
// (one block per batch at --batch-size 7): the cursor says so, no row is
// left unfilled in those blocks (the filled ones were updated, so their new
// versions may have moved to later blocks) while rows after them are; the
// next run continues from block 2, fills exactly those, and ends upgraded.
func TestBackfillResumesByBlock(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	before := db.Fingerprint(t)
	conn := testdb.Connect(t, db.DSN)
	stopOnlineAt(t, conn, online.PointBatch)
	p, ok, err := online.ReadProgress(ctx, db.Pool)
	if err != nil || !ok {
		t.Fatalf("no progress row: %v", err)
	}
	if p.NextBlock != 2 || p.Batches != 2 {
		t.Fatalf("after two batches of one block: next_block %d, batches %d; want 2 and 2", p.NextBlock, p.Batches)
	}
	var behind, ahead, filled int
	if err := db.Pool.QueryRow(ctx, `select count(*) filter (where ctid < '(2,0)' and queue_name is null),
		count(*) filter (where ctid >= '(2,0)' and queue_name is null), count(*) filter (where queue_name is not null)
		from pgflow.step_tasks`).Scan(&behind, &ahead, &filled); err != nil {
		t.Fatal(err)
	}
	if behind != 0 || ahead == 0 || filled == 0 || int64(filled) != p.RowsDone {
		t.Fatalf("blocks 0-1: %d rows unfilled (want 0); after them %d unfilled (want some); %d filled (want the %d the two batches did)", behind, ahead, filled, p.RowsDone)
	}
	rep := applyOnline(t, conn, "resume")
	if rep.Report.Backfill.Batches == 0 || rep.Report.Backfill.Rows != int64(ahead) {
		t.Fatalf("the resumed run filled %d rows in %d batches; want the %d rows from block 2 on", rep.Report.Backfill.Rows, rep.Report.Backfill.Batches, ahead)
	}
	checkUpgraded(t, db, before)
}

// An UPDATE of a row the backfill has not reached writes its new version
// wherever there is room, here into block 0, which the cursor has passed;
// the trigger fills it (it fires on UPDATE of an unfilled row), so nothing
// is left behind the cursor, and the run ends upgraded.
func TestBackfillCoversRowsMovedBehindTheCursor(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	stopOnlineAt(t, conn, online.PointBatch) // blocks 0 and 1 swept
	// Room in block 0: remove some of its (filled) rows and vacuum, so the
	// free space map offers block 0 to the next non-HOT update.
	if _, err := db.Pool.Exec(ctx, `delete from pgflow.step_tasks where ctid < '(0,30)'`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `vacuum pgflow.step_tasks`); err != nil {
		t.Fatal(err)
	}
	// Update every row of block 5 (a full page: no HOT update possible),
	// as the 0.16.0 engine does (start_tasks sets status and attempts).
	var moved, movedNull, updated int
	if err := db.Pool.QueryRow(ctx, `with u as (
			update pgflow.step_tasks set attempts_count = attempts_count + 1
			where ctid >= '(5,0)' and ctid < '(6,0)' returning ctid, queue_name)
		select count(*) filter (where ctid < '(2,0)'), count(*) filter (where ctid < '(2,0)' and queue_name is null), count(*) from u`).Scan(&moved, &movedNull, &updated); err != nil {
		t.Fatal(err)
	}
	if updated == 0 || moved == 0 {
		t.Fatalf("setup: %d rows updated, %d of them moved behind the cursor (want some of each)", updated, moved)
	}
	if movedNull != 0 {
		t.Fatalf("%d of the %d rows moved behind the cursor have no queue_name: the trigger did not fill them", movedNull, moved)
	}
	applyOnline(t, conn, "resume")
	checkUpgraded(t, db, nil)
}

// The 0.16.0 engine keeps inserting and updating tasks during the whole
// backfill (start_flow, start_tasks, complete_task, fail_task); every row
// ends with queue_name = lower(flow_slug) and the catalog is 0.17.0's.
func TestBackfillUnderConcurrentWrites(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	conn := testdb.Connect(t, db.DSN)
	var batches atomic.Int32
	stop := make(chan struct{})
	var stopOnce sync.Once
	var wg sync.WaitGroup
	var writes atomic.Int32
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, s := range []string{
				`select pgflow.start_flow('root_map', '[1, 2, 3, 4, 5, 6]')`,
				`select count(*) from pgflow.start_tasks('root_map', array(select msg_id from pgmq.read('root_map', 30, 4)), '00000000-0000-0000-0000-0000000000aa')`,
				`select count(*) from (select run_id, step_slug, task_index from pgflow.step_tasks where status = 'started' and flow_slug = 'root_map' order by random() limit 1) t,
					lateral pgflow.complete_task(t.run_id, t.step_slug, t.task_index, '1') c`,
				`update pgflow.step_tasks set error_message = 'touched ` + fmt.Sprint(i) + `' where (run_id, step_slug, task_index) in (select run_id, step_slug, task_index from pgflow.step_tasks where status = 'queued' order by random() limit 5)`,
			} {
				if _, err := db.Pool.Exec(ctx, s); err != nil {
					werr = fmt.Errorf("%s: %w", s, err)
					return
				}
				writes.Add(1)
			}
		}
	}()
	rep, err := online.Upgrade(ctx, conn, online.Options{BatchSize: 7, Pause: 5 * time.Millisecond, Hooks: online.Hooks{At: func(_ context.Context, _ uint32, p string) error {
		switch p {
		case online.PointBatch:
			batches.Add(1)
		case online.PointSwitch: // the 0.16.0 engine stops where its functions go
			stopOnce.Do(func() { close(stop) })
			wg.Wait()
		}
		return nil
	}}})
	stopOnce.Do(func() { close(stop) })
	wg.Wait()
	if werr != nil {
		t.Fatalf("the 0.16.0 engine during the backfill: %v", werr)
	}
	if err != nil || rep.Outcome != outcome.Applied {
		t.Fatalf("apply --online under writes: %v %+v", err, rep)
	}
	if batches.Load() < 5 || writes.Load() < 8 {
		t.Fatalf("too little overlap to mean anything: %d batches, %d writes", batches.Load(), writes.Load())
	}
	t.Logf("%d writes during %d batches; backfill %+v", writes.Load(), batches.Load(), rep.Report.Backfill)
	checkUpgraded(t, db, nil)
}

// Two tasks of one queue sharing a message id: apply --online does not scan
// for them up front; the unique index build finds them, the refusal carries
// the audit check's findings with samples (outcome refused, as the
// preflight's), and the database is exactly as before the run.
func TestOnlineDuplicateMessageIDsFoundByIndexBuild(t *testing.T) {
	ctx := context.Background()
	db := testdb.Inflight(t, 400)
	if _, err := db.Pool.Exec(ctx, `update pgflow.step_tasks set message_id = (select min(message_id) from pgflow.step_tasks where flow_slug = 'root_map')
		where flow_slug = 'root_map' and task_index in (5, 6) and run_id = '00000000-0000-0000-0000-000000000002'`); err != nil {
		t.Fatal(err)
	}
	before := db.Fingerprint(t)
	cat016 := readCatalog(t, db.Pool)
	conn := testdb.Connect(t, db.DSN)
	var phases []string
	rep, err := online.Upgrade(ctx, conn, online.Options{BatchSize: 50, Hooks: online.Hooks{At: func(_ context.Context, _ uint32, p string) error {
		phases = append(phases, p)
		return nil
	}}})
	if !errors.Is(err, online.ErrDuplicate) || !errors.Is(err, outcome.ErrPreflight) || rep.Outcome != outcome.Refused {
		t.Fatalf("want a refusal (duplicates, preflight): %v (%s)", err, rep.Outcome)
	}
	if len(rep.Report.Blockers) != 1 || rep.Report.Blockers[0].CheckID != "tasks.duplicate_message_id" || len(rep.Report.Blockers[0].Samples) == 0 {
		t.Fatalf("want the findings of tasks.duplicate_message_id with samples: %+v", rep.Report.Blockers)
	}
	if phases[len(phases)-1] != online.PointIndex {
		t.Fatalf("want it found by the index build (the last point reached): %v", phases)
	}
	sameCatalog(t, "after the refused online run, against the 0.16.0 catalog before", cat016, readCatalog(t, db.Pool))
	assertNothingLeft(t, db, before, "after the refused online run")
}
