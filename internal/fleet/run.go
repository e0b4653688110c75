package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Plan is how a run goes through its targets.
type Plan struct {
	// Canary targets run first, one at a time; unless every one of them
	// succeeds, nothing else starts.
	Canary int
	// Parallel targets at most run at once after the canaries.
	Parallel int
	// MaxFailures: after this many failed targets no new one starts
	// (0: no limit). Those running finish.
	MaxFailures int
}

// Do runs one target and returns its entry (Status done, skipped or
// interrupted). It must end soon after ctx is cancelled, with what it was
// doing committed or rolled back.
type Do func(ctx context.Context, t Target) Entry

// Run goes through todo (in order) as plan says, calling do for each
// target it starts and record for each change: the target running, its
// outcome, or not started. It returns why it stopped starting targets, if
// it did: a canary failed, the failure limit, ctx cancelled (Ctrl-C).
func Run(ctx context.Context, todo []Target, plan Plan, do Do, record func(Entry)) []string {
	s := &scheduler{plan: plan, do: do, record: record}
	canaries := min(plan.Canary, len(todo))
	for i, t := range todo[:canaries] {
		if ctx.Err() != nil {
			return s.stop(todo[i:], Interrupted)
		}
		// A canary passes only with exit 0 (one skipped as failed before
		// does not pass).
		if e := s.one(ctx, t); e.ExitCode != 0 {
			why := fmt.Sprintf("canary %s failed (exit %d): nothing else was started", t.Name, e.ExitCode)
			if e.Status == StatusInterrupted {
				why = Interrupted + " during canary " + t.Name
			}
			return s.stop(todo[i+1:], why)
		}
	}
	return s.pool(ctx, todo[canaries:])
}

type scheduler struct {
	plan   Plan
	do     Do
	record func(Entry)

	mu       sync.Mutex
	failures int
}

// one runs t: recorded as running, then its outcome.
func (s *scheduler) one(ctx context.Context, t Target) Entry {
	now := time.Now().UTC()
	s.record(Entry{Name: t.Name, Line: t.Line, Database: t.Database, Status: StatusRunning, StartedAt: &now})
	e := s.do(ctx, t)
	e.Name, e.Line, e.Database = t.Name, t.Line, t.Database
	if e.StartedAt == nil {
		e.StartedAt = &now
	}
	if e.FinishedAt == nil {
		end := time.Now().UTC()
		e.FinishedAt = &end
	}
	if e.Failed() {
		s.mu.Lock()
		s.failures++
		s.mu.Unlock()
	}
	s.record(e)
	return e
}

// pool runs rest with at most plan.Parallel at once, starting none after
// the failure limit or ctx's end.
func (s *scheduler) pool(ctx context.Context, rest []Target) []string {
	parallel := max(s.plan.Parallel, 1)
	slots := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, t := range rest {
		acquired := false
		select {
		case slots <- struct{}{}:
			acquired = true
		case <-ctx.Done():
		}
		if why := s.limit(ctx); why != "" {
			if acquired {
				<-slots
			}
			wg.Wait()
			return s.stop(rest[i:], why)
		}
		wg.Add(1)
		go func(t Target) {
			defer wg.Done()
			defer func() { <-slots }()
			s.one(ctx, t)
		}(t)
	}
	wg.Wait()
	return nil
}

// limit says why no new target may start, "" when one may.
func (s *scheduler) limit(ctx context.Context) string {
	if ctx.Err() != nil {
		return Interrupted
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.plan.MaxFailures > 0 && s.failures >= s.plan.MaxFailures {
		return fmt.Sprintf("%d target(s) failed, the limit of --max-failures %d", s.failures, s.plan.MaxFailures)
	}
	return ""
}

// stop records the targets of left as not started and returns why.
func (s *scheduler) stop(left []Target, why string) []string {
	if len(left) == 0 {
		return []string{why}
	}
	for _, t := range left {
		s.record(Entry{Name: t.Name, Line: t.Line, Database: t.Database, Status: StatusNotStarted, Verdict: VerdictNotStarted, Cause: "not started: " + why})
	}
	return []string{fmt.Sprintf("%s; %d target(s) not started", why, len(left))}
}
