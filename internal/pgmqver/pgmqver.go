// Package pgmqver holds what the tool knows about pgmq's versions, read
// from pgmq's own update scripts 1.5.1 → 1.13.1: which layout each has,
// which steps of the update fail on what, and which versions break pgflow's
// claim path. The audit reports from it and `apply --pgmq` acts on it, so
// both say the same thing.
package pgmqver

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is a pgmq extension version, major.minor.patch.
type Version [3]int

// Parse reads "1.13.1" (a missing patch is 0). Anything else is an error:
// the caller says nothing rather than guess.
func Parse(s string) (Version, error) {
	var v Version
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return v, fmt.Errorf("pgmq version %q: want major.minor.patch", s)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return v, fmt.Errorf("pgmq version %q: want major.minor.patch", s)
		}
		v[i] = n
	}
	return v, nil
}

// MustParse is Parse for the constants below.
func MustParse(s string) Version {
	v, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return v
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) }

// Less orders versions as numbers (1.9.0 < 1.10.0).
func (v Version) Less(w Version) bool {
	for i := range v {
		if v[i] != w[i] {
			return v[i] < w[i]
		}
	}
	return false
}

// The versions whose update steps matter to a pgflow database.
var (
	// Detached: from 1.6.0 the queue and archive tables (and the queue's
	// sequence) are no longer members of the extension, and pgmq.meta is
	// marked for pg_dump; below it pg_dump leaves all of them out.
	Detached = MustParse("1.6.0")
	// LastReadAt: the 1.9.0 → 1.10.0 step adds last_read_at to every
	// queue and archive table, altering pgmq."q_<pgmq.meta name>" (quoted),
	// and recreates pgmq.message_record with last_read_at in fourth place.
	LastReadAt = MustParse("1.10.0")
	// ClaimFixed: 1.11.0 rewrites read, pop and set_vt to name their
	// columns; in 1.10.0 and 1.10.1 they return the table's row as
	// message_record, which a queue created before 1.10.0 (last_read_at
	// appended last) does not match: 42804 (read_with_poll: 22007).
	ClaimFixed = MustParse("1.11.0")
)

// MembersLayout says whether v keeps its queue tables as extension members
// (below 1.6.0): pg_dump then leaves them, their rows and pgmq.meta out.
func MembersLayout(v Version) bool { return v.Less(Detached) }

// Layout names v's membership layout in one phrase.
func Layout(v Version) string {
	if MembersLayout(v) {
		return "queue tables are extension members (below 1.6.0)"
	}
	return "queue tables are not extension members (1.6.0 and later)"
}

// BreaksClaim: v is 1.10.0 or 1.10.1, where read, pop and set_vt fail on
// queues created before 1.10.0.
func BreaksClaim(v Version) bool { return !v.Less(LastReadAt) && v.Less(ClaimFixed) }

// CrossesLastReadAt: an update from → to runs the 1.9.0 → 1.10.0 step.
func CrossesLastReadAt(from, to Version) bool { return from.Less(LastReadAt) && !to.Less(LastReadAt) }

// MismatchedMetaSQL lists the pgmq.meta rows whose queue table, named as
// the 1.9.0 → 1.10.0 step names it ('q_' || queue_name, exactly), does not
// exist: that step fails on the first of them (42P01). For each: the
// listed name, the table pgmq's functions use ('q_' || lower(name)),
// whether that table exists, and whether the lower-case spelling is listed
// too. Catalog reads and pgmq.meta only; $1 limits the rows (null: all).
const MismatchedMetaSQL = `
select m.queue_name::text,
       'q_' || pg_catalog.lower(m.queue_name::text),
       exists (select 1 from pg_catalog.pg_class c
               join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
               where c.relname = 'q_' || pg_catalog.lower(m.queue_name::text) and c.relkind in ('r', 'p')),
       exists (select 1 from pgmq.meta o where o.queue_name::text = pg_catalog.lower(m.queue_name::text))
from pgmq.meta m
where not exists (select 1 from pg_catalog.pg_class c
                  join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
                  where c.relname = 'q_' || m.queue_name::text and c.relkind in ('r', 'p'))
order by m.queue_name
limit $1`

// Mismatch is one row of MismatchedMetaSQL.
type Mismatch struct {
	Name        string // as listed in pgmq.meta
	Table       string // the table pgmq's functions use, q_<lower(name)>
	TableExists bool   // false: the queue is damaged, no rename helps
	LowerListed bool   // lower(name) is listed too: two spellings of one queue
}

// Repairable: renaming the listed name to lower case (or dropping it when
// the lower spelling is listed too) makes the 1.9.0 → 1.10.0 step find the
// queue's table.
func (m Mismatch) Repairable() bool { return m.TableExists }

// StaleClaimTablesSQL counts the queue tables (q_ of the listed queues)
// whose columns, in order, are not those of pgmq.message_record: on 1.10.0
// and 1.10.1 read, pop and set_vt fail on each (42804), and returns up to
// $1 of their queue names.
const StaleClaimTablesSQL = `
with rec as (
  select pg_catalog.array_agg(a.attname::text order by a.attnum) as cols
  from pg_catalog.pg_attribute a
  where a.attrelid = (select t.typrelid from pg_catalog.pg_type t
                      join pg_catalog.pg_namespace n on n.oid = t.typnamespace and n.nspname = 'pgmq'
                      where t.typname = 'message_record')
    and a.attnum > 0 and not a.attisdropped
),
tabs as (
  select m.queue_name::text as queue_name,
         (select pg_catalog.array_agg(a.attname::text order by a.attnum)
          from pg_catalog.pg_attribute a
          join pg_catalog.pg_class c on c.oid = a.attrelid
          join pg_catalog.pg_namespace n on n.oid = c.relnamespace and n.nspname = 'pgmq'
          where c.relname = 'q_' || pg_catalog.lower(m.queue_name::text) and a.attnum > 0 and not a.attisdropped) as cols
  from pgmq.meta m
),
stale as (select t.queue_name from tabs t, rec r where t.cols is not null and t.cols is distinct from r.cols)
select (select pg_catalog.count(*) from stale),
       coalesce((select pg_catalog.array_agg(s.queue_name order by s.queue_name) from (select queue_name from stale order by queue_name limit $1) s), '{}')`
