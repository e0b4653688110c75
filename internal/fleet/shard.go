package fleet

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Shard is one of N parts of a fleet (--shard I/N, I from 1 to N), for a CI
// matrix: each job runs its shard with its own ledger, and `fleet report`
// merges the ledgers. The zero Shard is the whole fleet.
type Shard struct{ I, N int }

// ParseShard reads "I/N".
func ParseShard(s string) (Shard, error) {
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 1 || i > n {
		return Shard{}, fmt.Errorf("--shard %q: want I/N with 1 <= I <= N (e.g. 2/4: the second of four)", s)
	}
	return Shard{I: i, N: n}, nil
}

// String is "I/N", "" for the whole fleet.
func (s Shard) String() string {
	if s.N <= 1 {
		return ""
	}
	return fmt.Sprintf("%d/%d", s.I, s.N)
}

// Of says which shard (1..n) a target name belongs to: FNV-1a of the
// name, so the assignment depends on the name alone, not on the order or
// the number of lines of the file.
func Of(name string, n int) int {
	if n <= 1 {
		return 1
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	return int(h.Sum64()%uint64(n)) + 1
}

// Select returns the targets of shard s, in file order.
func (s Shard) Select(all []Target) []Target {
	if s.N <= 1 {
		return all
	}
	var out []Target
	for _, t := range all {
		if Of(t.Name, s.N) == s.I {
			out = append(out, t)
		}
	}
	return out
}
