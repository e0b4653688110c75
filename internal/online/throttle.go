package online

import (
	"context"
	"fmt"
	"time"
)

// throttle paces the backfill: at most maxRate rows/s over the run (0: no
// limit), and at least pause between batches.
type throttle struct {
	maxRate float64
	pause   time.Duration
	start   time.Time
	rows    int64
}

// delay is how long to sleep after a batch, so that rows done since start
// stay at or below maxRate, and never less than pause.
func (t *throttle) delay(now time.Time, rows int64) time.Duration {
	t.rows += rows
	d := t.pause
	if t.maxRate > 0 {
		due := t.start.Add(time.Duration(float64(t.rows) / t.maxRate * float64(time.Second)))
		if w := due.Sub(now); w > d {
			d = w
		}
	}
	return d
}

// ReplicaLag is one standby's replay lag as pg_stat_replication shows it.
type ReplicaLag struct {
	Name string        // application_name of the walsender's client
	Lag  time.Duration // replay_lag; 0 when the server reports none (idle, caught up)
}

// lagDecision says whether the backfill must wait for its replicas: when
// any replica's replay lag exceeds limit (limit <= 0: never wait). It
// returns the worst replica.
func lagDecision(lags []ReplicaLag, limit time.Duration) (wait bool, worst ReplicaLag) {
	for _, l := range lags {
		if l.Lag > worst.Lag {
			worst = l
		}
	}
	return limit > 0 && worst.Lag > limit, worst
}

// replicaLags reads pg_stat_replication. replay_lag is null once a standby
// has caught up and nothing is written (and for roles without
// pg_read_all_stats), which counts as no lag.
func replicaLags(ctx context.Context, q Querier) ([]ReplicaLag, error) {
	rows, err := q.Query(ctx, `
		select coalesce(r.application_name, ''),
		       coalesce(extract(epoch from r.replay_lag), 0)::double precision
		from pg_catalog.pg_stat_replication r`)
	if err != nil {
		return nil, fmt.Errorf("online: reading pg_stat_replication: %w", err)
	}
	defer rows.Close()
	var out []ReplicaLag
	for rows.Next() {
		var l ReplicaLag
		var secs float64
		if err := rows.Scan(&l.Name, &secs); err != nil {
			return nil, fmt.Errorf("online: reading pg_stat_replication: %w", err)
		}
		l.Lag = time.Duration(secs * float64(time.Second))
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("online: reading pg_stat_replication: %w", err)
	}
	return out, nil
}

// sizer adapts the batch size so that a batch takes about target: halved
// when one took longer, grown by half when one took less than half of it,
// always within [minBatch, max].
type sizer struct {
	size, max int
	target    time.Duration
}

const minBatch = 10

func (s *sizer) next(took time.Duration) int {
	lo := min(minBatch, s.max)
	switch {
	case took > s.target:
		s.size /= 2
	case took < s.target/2:
		s.size += s.size/2 + 1
	}
	s.size = min(max(s.size, lo), s.max)
	return s.size
}
