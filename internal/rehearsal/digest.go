package rehearsal

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/capture"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/fingerprint"
)

// A digest is the rehearsal's fingerprint: the same comparison as
// fingerprint.Compare (every pre-existing row of pgflow's tables, pgmq's
// queue list and every queue's live and archived messages, on the columns
// they had before), in bounded memory whatever the database's size. The
// server hashes each row (md5 of its values as jsonb, time zone UTC) and
// returns the rows sorted by key; the hashes before the upgrade go to a
// file, and the rows after are merged against it, one line at a time.

type digestTable struct {
	label   string // as fingerprint names it: "pgflow.runs", "pgmq queue x"
	schema  string // of a table ("" for pgmq's queue list)
	table   string
	from    string // the relation or function to read, with alias t
	columns []string
	key     []string
	file    string
	rows    int64
}

type digest struct {
	dir    string
	tables []*digestTable
	rows   int64
}

// takeDigest writes the digest of db's current state under a new
// temporary directory (removed by close). Without queueList, pgmq's queue
// list is left to the caller (the pgmq hop renames mixed-case names on
// purpose; survives compares the list with its report).
func takeDigest(ctx context.Context, pool *pgxpool.Pool, queueList bool) (*digest, error) {
	dir, err := os.MkdirTemp("", "pgflow-upgrade-digest-")
	if err != nil {
		return nil, fmt.Errorf("digest: %w", err)
	}
	d := &digest{dir: dir}
	err = snapshot(ctx, pool, func(tx pgx.Tx) error {
		for _, name := range fingerprint.Tables {
			cols, key, ok, err := tableShape(ctx, tx, "pgflow", name)
			if err != nil {
				return err
			}
			if ok {
				d.tables = append(d.tables, &digestTable{label: "pgflow." + name, schema: "pgflow", table: name,
					from: pgx.Identifier{"pgflow", name}.Sanitize(), columns: cols, key: key})
			}
		}
		if queueList {
			d.tables = append(d.tables, &digestTable{label: fingerprint.QueueList, from: "pgmq.list_queues()",
				columns: []string{"queue_name", "is_partitioned", "is_unlogged", "created_at"}, key: []string{"queue_name"}})
		}
		queues, err := capture.QueueNames(ctx, tx)
		if err != nil {
			return err
		}
		for _, q := range queues {
			for _, k := range []struct{ prefix, label string }{{"q_", fingerprint.QueueTable(q)}, {"a_", fingerprint.ArchiveTable(q)}} {
				cols, _, ok, err := tableShape(ctx, tx, "pgmq", k.prefix+strings.ToLower(q))
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("digest: pgmq lists queue %q but table pgmq.%s does not exist", q, k.prefix+strings.ToLower(q))
				}
				table := k.prefix + strings.ToLower(q)
				d.tables = append(d.tables, &digestTable{label: k.label, schema: "pgmq", table: table,
					from: pgx.Identifier{"pgmq", table}.Sanitize(), columns: cols, key: []string{"msg_id"}})
			}
		}
		for i, t := range d.tables {
			t.file = filepath.Join(dir, fmt.Sprintf("%04d", i))
			if err := t.write(ctx, tx); err != nil {
				return err
			}
			d.rows += t.rows
		}
		return nil
	})
	if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *digest) close() { _ = os.RemoveAll(d.dir) }

// snapshot runs f in one REPEATABLE READ, READ ONLY transaction, time zone UTC.
func snapshot(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) error) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("digest: opening a snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "set local timezone to 'UTC'"); err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	return f(tx)
}

// tableShape: a table's columns and primary key (all columns without one).
func tableShape(ctx context.Context, tx pgx.Tx, schema, table string) (cols, key []string, ok bool, err error) {
	err = tx.QueryRow(ctx, `select c.oid is not null,
			coalesce((select pg_catalog.array_agg(a.attname::text order by a.attnum) from pg_catalog.pg_attribute a
				where a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.>) 0 and not a.attisdropped), '{}'),
			coalesce((select pg_catalog.array_agg(a.attname::text order by k.ord) from pg_catalog.pg_index i
				cross join lateral pg_catalog.unnest(i.indkey::pg_catalog.int2[]) with ordinality k(attnum, ord)
				join pg_catalog.pg_attribute a on a.attrelid operator(pg_catalog.=) c.oid and a.attnum operator(pg_catalog.=) k.attnum
				where i.indrelid operator(pg_catalog.=) c.oid and i.indisprimary), '{}')
		from (select 1) one left join pg_catalog.pg_class c on c.oid operator(pg_catalog.=) pg_catalog.to_regclass($1)`,
		pgx.Identifier{schema, table}.Sanitize()).Scan(&ok, &cols, &key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("digest: reading the columns of %s.%s: %w", schema, table, err)
	}
	if len(key) == 0 {
		key = cols
	}
	return cols, key, ok, nil
}

// rowsSQL selects (key, hash of the columns) of every row, by key.
func (t *digestTable) rowsSQL() string {
	ref := func(cols []string) string {
		out := make([]string, len(cols))
		for i, c := range cols {
			out[i] = "t." + pgx.Identifier{c}.Sanitize()
		}
		return strings.Join(out, ", ")
	}
	return "select pg_catalog.jsonb_build_array(" + ref(t.key) + ")::text collate \"C\" as k, pg_catalog.md5(pg_catalog.jsonb_build_array(" +
		ref(t.columns) + ")::text) from " + t.from + " t order by 1"
}

// eachRow calls fn with each (key, row hash) of the table as it is now, in
// key order (rowsSQL).
func (t *digestTable) eachRow(ctx context.Context, tx pgx.Tx, fn func(k, h string)) error {
	rows, err := tx.Query(ctx, t.rowsSQL())
	if err != nil {
		return fmt.Errorf("digest: reading %s: %w", t.label, err)
	}
	var k, h string
	if _, err := pgx.ForEachRow(rows, []any{&k, &h}, func() error { fn(k, h); return nil }); err != nil {
		return fmt.Errorf("digest: reading %s: %w", t.label, err)
	}
	return nil
}

func (t *digestTable) write(ctx context.Context, tx pgx.Tx) error {
	f, err := os.Create(t.file)
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	if err := t.eachRow(ctx, tx, func(k, h string) {
		// jsonb's text escapes tabs and newlines: one line per row.
		fmt.Fprintf(w, "%s\t%s\n", k, h)
		t.rows++
	}); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	return f.Close()
}

// compare lists what of the digest is not in db's state now unchanged
// (missing tables, columns and rows; rows whose pre-existing columns
// changed), at most max of them, and how many there are in all.
func (d *digest) compare(ctx context.Context, pool *pgxpool.Pool, max int) (diffs []string, total int, err error) {
	note := func(format string, args ...any) {
		total++
		if len(diffs) < max {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	err = snapshot(ctx, pool, func(tx pgx.Tx) error {
		for _, t := range d.tables {
			if t.schema != "" {
				cols, _, ok, err := tableShape(ctx, tx, t.schema, t.table)
				if err != nil {
					return err
				}
				if !ok {
					note("%s: table missing (had %d rows)", t.label, t.rows)
					continue
				}
				have := map[string]bool{}
				for _, c := range cols {
					have[c] = true
				}
				missing := false
				for _, c := range t.columns {
					if !have[c] {
						note("%s: column %s missing", t.label, c)
						missing = true
					}
				}
				if missing {
					continue
				}
			}
			if err := t.merge(ctx, tx, note); err != nil {
				return err
			}
		}
		return nil
	})
	return diffs, total, err
}

// merge walks the file and the rows now, both by key.
func (t *digestTable) merge(ctx context.Context, tx pgx.Tx, note func(string, ...any)) error {
	f, err := os.Open(t.file)
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<30)
	var bk, bh string
	nextBefore := func() bool {
		if !sc.Scan() {
			return false
		}
		bk, bh, _ = strings.Cut(sc.Text(), "\t")
		return true
	}
	haveBefore := nextBefore()
	if err := t.eachRow(ctx, tx, func(k, h string) {
		for haveBefore && bk < k {
			note("%s %s: row missing", t.label, bk)
			haveBefore = nextBefore()
		}
		if haveBefore && bk == k {
			if bh != h {
				note("%s %s: row changed", t.label, k)
			}
			haveBefore = nextBefore()
		}
		// A key only after is a row added: not a difference (fingerprint.Added).
	}); err != nil {
		return err
	}
	for haveBefore {
		note("%s %s: row missing", t.label, bk)
		haveBefore = nextBefore()
	}
	return sc.Err()
}
