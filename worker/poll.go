package worker

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"
)

// pollLoop polls the canonical route for as many messages as there are free
// slots (at most BatchSize), claims them with start_tasks and runs each task
// in its own goroutine.
func (w *Worker) pollLoop() {
	defer w.loops.Done()
	backoff := time.Duration(0)
	for {
		// Wait for one free slot, then take every other free one.
		select {
		case w.slots <- struct{}{}:
		case <-w.fetchCtx.Done():
			return
		}
		n := 1
	more:
		for n < w.cfg.BatchSize {
			select {
			case w.slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		if !w.linger(&n) {
			w.freeSlots(n)
			return
		}

		tasks, err := w.pollAndClaim(n)
		if err != nil {
			w.freeSlots(n)
			if w.fetchCtx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			w.log.LogAttrs(w.hardCtx, slog.LevelError, "poll or claim failed", slog.Any("error", err), slog.Duration("retry_in", backoff))
			if !w.sleep(backoff) {
				return
			}
			continue
		}
		backoff = 0
		w.freeSlots(n - len(tasks))
		for _, t := range tasks {
			w.inflight.Add(1)
			go w.runTask(t)
		}
		if w.fetchCtx.Err() != nil {
			return
		}
	}
}

// pollAndClaim is one pass: read_with_poll for up to n messages, then
// start_tasks on the ids read. Messages start_tasks did not claim are
// warned about and left to come back after their visibility timeout.
func (w *Worker) pollAndClaim(n int) ([]ClaimedTask, error) {
	// The poll runs on fetchCtx: a stop cancels it. Messages it read that
	// nobody claims come back after VisibilityTimeout, unclaimed.
	ids, err := ReadMessages(w.fetchCtx, w.pool, ReadParams{
		Queue: w.queue, VisibilityTimeout: w.cfg.VisibilityTimeout, Qty: n,
		MaxPollSeconds: w.cfg.MaxPollSeconds, PollInterval: w.cfg.PollInterval,
	})
	if err != nil {
		return nil, err
	}
	w.n.polls.Add(1)
	w.n.read.Add(int64(len(ids)))
	if len(ids) == 0 || w.fetchCtx.Err() != nil {
		return nil, nil
	}
	// The claim runs on hardCtx, not fetchCtx: a soft stop never cuts it off
	// after the database has handed tasks over; what it claims runs.
	tasks, err := StartTasks(w.hardCtx, w.pool, StartParams{
		FlowSlug: w.cfg.Flow.Slug, MessageIDs: ids, WorkerID: w.cfg.WorkerID,
		Queue: w.queue, StepSlug: w.cfg.StepSlug,
	})
	if err != nil {
		// Logged by the poll loop, which then backs off.
		w.n.claimErrors.Add(1)
		return nil, fmt.Errorf("messages %v come back after their visibility timeout: %w", ids, err)
	}
	w.n.claimCalls.Add(1)
	w.n.claimed.Add(int64(len(tasks)))
	if len(tasks) < len(ids) {
		claimed := make(map[int64]bool, len(tasks))
		for _, t := range tasks {
			claimed[t.MessageID] = true
		}
		var left []int64
		for _, id := range ids {
			if !claimed[id] {
				left = append(left, id)
			}
		}
		w.n.unclaimed.Add(int64(len(left)))
		w.log.LogAttrs(w.hardCtx, slog.LevelWarn, "messages read but not claimed: they come back after their visibility timeout",
			slog.String("queue_name", w.queue), slog.Any("msg_ids", idStrings(left)),
			slog.String("flow_slug", w.cfg.Flow.Slug), slog.String("step_slug", w.cfg.StepSlug))
	}
	return tasks, nil
}

// observeWrite folds one outcome write's round trip into writeNanos (an
// exponential moving average, weight 1/8; a lost update under concurrency
// only makes it a little less smooth).
func (w *Worker) observeWrite(d time.Duration) {
	old := w.writeNanos.Load()
	w.writeNanos.Store(old + (int64(d)-old)/8)
}

// writeWaitFactor: once ClaimLinger has passed, the poll loop keeps waiting
// for slots held by outcome writes up to this many recent write round trips.
// A write slower than that is an outlier (a lock behind a long transaction)
// that should not idle the slots already free.
const writeWaitFactor = 4

// writeWait is how much longer linger may wait once ClaimLinger has passed,
// with taken slots already held by the poll loop: when every other busy slot
// belongs to a task whose handler has returned, so that only its outcome
// write (and OnResult) holds it, up to writeWaitFactor recent write round
// trips (at most WriteTimeout); else 0. Those slots free as soon as the
// database answers, and a poll before then only adds a call to the load that
// slows the writes; a slot held by a running handler may stay busy for any
// time, and is not waited for.
func (w *Worker) writeWait(taken int) time.Duration {
	busy := int64(len(w.slots) - taken)
	if busy <= 0 || w.pastHandler.Load() < busy {
		return 0
	}
	return min(writeWaitFactor*time.Duration(w.writeNanos.Load()), w.cfg.WriteTimeout)
}

// linger waits for more free slots while handlers still run, so one poll
// serves several tasks (every read_with_poll + start_tasks pair has a fixed
// cost on the server); n counts the slots taken. It waits ClaimLinger, then
// writeWait more if only outcome writes hold the other slots. It returns
// false when the poll loop is stopped meanwhile.
func (w *Worker) linger(n *int) bool {
	want := min(w.cfg.BatchSize, w.cfg.Concurrency)
	if w.cfg.ClaimLinger <= 0 || *n >= want || len(w.slots) == *n {
		return true // nothing to gain, or no handler running that could free a slot
	}
	t := time.NewTimer(w.cfg.ClaimLinger)
	defer t.Stop()
	extended := false
	for *n < want {
		select {
		case w.slots <- struct{}{}:
			*n++
		case <-t.C:
			if extended {
				return true
			}
			d := w.writeWait(*n)
			if d <= 0 {
				return true
			}
			extended = true
			t.Reset(d)
		case <-w.fetchCtx.Done():
			return false
		}
	}
	return true
}

func (w *Worker) freeSlots(n int) {
	for range n {
		<-w.slots
	}
}

// sleep waits d unless the poll loop is stopped first.
func (w *Worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.fetchCtx.Done():
		return false
	}
}

// idStrings spells message ids as decimal strings, so a JSON log keeps them
// exact (a JavaScript reader would round numbers above 2^53).
func idStrings(ids []int64) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strconv.FormatInt(id, 10)
	}
	return out
}
