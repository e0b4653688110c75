package online

import (
	"testing"
	"time"
)

// The replica-lag decision (no standby here: the code path that reads
// pg_stat_replication runs in every backfill, this is the decision).
func TestLagDecision(t *testing.T) {
	cases := []struct {
		name  string
		lags  []ReplicaLag
		limit time.Duration
		wait  bool
		worst string
	}{
		{"no replicas", nil, time.Second, false, ""},
		{"all below", []ReplicaLag{{"a", 100 * time.Millisecond}, {"b", 900 * time.Millisecond}}, time.Second, false, "b"},
		{"exactly at the limit", []ReplicaLag{{"a", time.Second}}, time.Second, false, "a"},
		{"one above", []ReplicaLag{{"a", 10 * time.Millisecond}, {"b", 3 * time.Second}}, time.Second, true, "b"},
		{"idle standby (null lag = 0)", []ReplicaLag{{"a", 0}}, time.Second, false, ""},
		{"disabled", []ReplicaLag{{"a", time.Hour}}, 0, false, "a"},
		{"disabled (negative)", []ReplicaLag{{"a", time.Hour}}, -1, false, "a"},
	}
	for _, c := range cases {
		wait, worst := lagDecision(c.lags, c.limit)
		if wait != c.wait || worst.Name != c.worst {
			t.Errorf("%s: wait %v worst %q, want %v %q", c.name, wait, worst.Name, c.wait, c.worst)
		}
	}
}

func TestThrottleKeepsTheRate(t *testing.T) {
	start := time.Unix(1000, 0)
	th := &throttle{maxRate: 1000, start: start}
	// 500 rows done at once: due at start+0.5s.
	if d := th.delay(start.Add(100*time.Millisecond), 500); d != 400*time.Millisecond {
		t.Fatalf("delay %s, want 400ms", d)
	}
	// Late already: no delay beyond the pause.
	th.pause = 5 * time.Millisecond
	if d := th.delay(start.Add(10*time.Second), 500); d != 5*time.Millisecond {
		t.Fatalf("delay %s, want the 5ms pause", d)
	}
	free := &throttle{start: start}
	if d := free.delay(start, 1_000_000); d != 0 {
		t.Fatalf("no rate, no pause: delay %s", d)
	}
}

func TestSizerAdapts(t *testing.T) {
	s := &sizer{size: 1000, max: 5000, target: 100 * time.Millisecond}
	if n := s.next(300 * time.Millisecond); n != 500 {
		t.Fatalf("slow batch: %d, want 500", n)
	}
	if n := s.next(10 * time.Millisecond); n != 751 {
		t.Fatalf("fast batch: %d, want 751", n)
	}
	if n := s.next(70 * time.Millisecond); n != 751 {
		t.Fatalf("on target: %d, want 751", n)
	}
	for i := 0; i < 20; i++ {
		s.next(time.Millisecond)
	}
	if s.size != 5000 {
		t.Fatalf("grows to max: %d", s.size)
	}
	tiny := &sizer{size: 5, max: 5, target: time.Millisecond}
	if n := tiny.next(time.Second); n != 5 {
		t.Fatalf("a max below minBatch is also the floor: %d, want 5", n)
	}
}
