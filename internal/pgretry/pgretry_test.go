package pgretry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestJitterStaysInHalfOpenRange(t *testing.T) {
	for i := 0; i < 1000; i++ {
		d := Jitter(100 * time.Millisecond)
		if d < 50*time.Millisecond || d >= 100*time.Millisecond {
			t.Fatalf("Jitter(100ms) = %s, want [50ms, 100ms)", d)
		}
	}
}

func TestBackoffDoublesUpToMax(t *testing.T) {
	b := Backoff{Initial: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	for i, upper := range []time.Duration{10, 20, 40, 40, 40} {
		d := b.Next()
		if d < upper*time.Millisecond/2 || d >= upper*time.Millisecond {
			t.Fatalf("wait %d = %s, want in [%s, %s)", i, d, upper*time.Millisecond/2, upper*time.Millisecond)
		}
	}
}

func TestRetryRetriesLockErrorsThenGivesUp(t *testing.T) {
	busy := &pgconn.PgError{Code: "55P03"}
	calls, retries := 0, 0
	err := Retry(context.Background(), Policy{Retries: 2, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
		LockError, func(int, error, time.Duration) { retries++ },
		func(int) error { calls++; return busy })
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.Attempts != 3 || calls != 3 || retries != 2 {
		t.Fatalf("err %v (attempts %v), calls %d, retries %d; want exhausted after 3 calls and 2 retries", err, ex, calls, retries)
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "55P03" {
		t.Fatalf("the last lock error is not reachable: %v", err)
	}
}

func TestRetryStopsOnOtherErrors(t *testing.T) {
	other := errors.New("syntax")
	calls := 0
	err := Retry(context.Background(), Policy{Retries: 5, Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond}},
		LockError, nil, func(int) error { calls++; return other })
	if !errors.Is(err, other) || calls != 1 {
		t.Fatalf("err %v after %d calls; want the error at once", err, calls)
	}
}

func TestPollWaitsThenGivesUp(t *testing.T) {
	tries := 0
	err := Poll(context.Background(), 120*time.Millisecond, func(context.Context) (bool, error) { tries++; return false, nil })
	if !errors.Is(err, ErrNotAcquired) || tries < 2 {
		t.Fatalf("err %v after %d tries; want ErrNotAcquired after several tries", err, tries)
	}
	tries = 0
	if err := Poll(context.Background(), 0, func(context.Context) (bool, error) { tries++; return tries == 1, nil }); err != nil || tries != 1 {
		t.Fatalf("err %v after %d tries; want success on the first", err, tries)
	}
}

func TestPollHonoursCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Poll(ctx, time.Minute, func(context.Context) (bool, error) { return false, nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}
