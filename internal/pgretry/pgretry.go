// Package pgretry is the one piece of waiting and retrying plumbing that
// `apply` (internal/upgrade) and `apply --online` (internal/online) share:
// polling an advisory lock without queueing for it, retrying lock-bound work
// with exponential backoff and equal jitter, and classifying lock errors
// (the limits themselves are set through session.Limits).
//
// Nothing here waits in PostgreSQL's lock queue: locks are tried (or bounded
// by lock_timeout by the caller), and the waiting happens here, in the
// client, where it blocks nobody.
package pgretry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Backoff is an exponential delay: Initial, doubled after each wait, at most Max.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	next    time.Duration
}

// Next returns the jittered delay to wait now and doubles the base for the
// next call.
func (b *Backoff) Next() time.Duration {
	if b.next == 0 {
		b.next = b.Initial
	}
	d := Jitter(b.next)
	b.next = min(b.next*2, b.Max)
	return d
}

// Jitter returns a duration in [d/2, d): "equal jitter", so retries of
// several clients do not line up, and each still waits about d.
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// Sleep waits d or until ctx is done (then it returns ctx.Err()).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// ErrNotAcquired is returned by Poll when the lock was still held by someone
// else when the wait ran out.
var ErrNotAcquired = errors.New("lock still held by another session")

// Poll calls try (e.g. pg_try_advisory_xact_lock) until it reports true,
// backing off from 50ms to 1s with jitter, for at most wait (0: one try).
// Polling instead of a blocking lock call keeps the caller out of the lock
// queue, so nothing waits behind it while it waits.
func Poll(ctx context.Context, wait time.Duration, try func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(wait)
	b := Backoff{Initial: 50 * time.Millisecond, Max: time.Second}
	for {
		ok, err := try(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return ErrNotAcquired
		}
		if err := Sleep(ctx, min(b.Next(), left)); err != nil {
			return err
		}
	}
}

// Policy bounds Retry: Retries attempts after the first, waiting
// Backoff.Next() between them.
type Policy struct {
	Retries int
	Backoff Backoff
}

// ExhaustedError is returned by Retry when every attempt failed with a
// retryable error; Err is the last one.
type ExhaustedError struct {
	Attempts int
	Err      error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("%d attempts failed, the last with: %v", e.Attempts, e.Err)
}
func (e *ExhaustedError) Unwrap() error { return e.Err }

// Retry runs fn until it succeeds, fails with an error retryable does not
// accept, or the policy's attempts are used up (*ExhaustedError). onRetry,
// if set, hears about each retry before its wait. fn gets the attempt
// number, from 1.
func Retry(ctx context.Context, p Policy, retryable func(error) bool, onRetry func(attempt int, err error, wait time.Duration), fn func(attempt int) error) error {
	b := p.Backoff
	for attempt := 1; ; attempt++ {
		err := fn(attempt)
		if err == nil {
			return nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return err
		}
		if attempt > p.Retries {
			return &ExhaustedError{Attempts: attempt, Err: err}
		}
		w := b.Next()
		if onRetry != nil {
			onRetry(attempt, err, w)
		}
		if err := Sleep(ctx, w); err != nil {
			return err
		}
	}
}

// LockError reports whether err is a bounded lock wait that gave up:
// lock_not_available (55P03, lock_timeout or NOWAIT) or deadlock_detected
// (40P01: having waited first, we are the one the detector aborts). Both
// leave nothing changed once the attempt is rolled back, so both are retried.
func LockError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}
