package pglog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The log's chunks (design §3, "History and retention"): {p}log is split
// by seq range into chunks, tables of their own attached ahead of the
// sequence, beside a default partition that takes the rows no chunk
// covers (those of before the first chunk, and those of a sequence that
// outran the maintenance). Retention drops a whole chunk once every
// partition's position noted at now − retention had passed it, instead
// of deleting its rows one by one.
//
// {p}log_chunks lists the attached chunks, [lo, hi) of seq, and the seal
// of each: the maintenance transaction's own id (sealed_xid), taken after
// it read the sequence past the chunk's end. Every row of the chunk drew
// its seq before that read, and its writer had its id before it drew
// (the log's xid column comes first), so every writer of the chunk has an
// id below sealed_xid, a writer still running included. With the
// sequence's cache at 1 (an identity column's default) no session holds
// values drawn before it hands them out.

// chunking says how the log is split: chunks of width seqs, ahead of them
// attached beyond the sequence's last value.
type chunking struct {
	width int64
	ahead int
}

// chunksAhead is how many chunks are kept attached beyond the sequence:
// with chunks of a million, at the relay's pruning pass of once a minute
// the sequence outruns them only beyond 60,000 messages a second.
const chunksAhead = 4

// chunkLockTimeout bounds the wait of a chunk's attach and of its drop
// for their ACCESS EXCLUSIVE lock on the log, which every statement on
// the log queues behind: they give up soon, and the next pass tries
// again.
const chunkLockTimeout = "100ms"

// ChunkLog makes the empty log of migration 12, named with prefix, a
// table partitioned by seq range with the same columns, defaults,
// indexes and update trigger (migration 14), beside a default partition,
// and adds the list of chunks. The
// old table's indexes are renamed first, so that the new ones take their
// names (the one PostgreSQL names after its column is renamed after).
func ChunkLog(prefix string) string {
	return strings.ReplaceAll(`
ALTER TABLE {p}log RENAME TO {p}log_whole;
ALTER INDEX {p}log_pkey RENAME TO {p}log_whole_pkey;
ALTER INDEX {p}log_xid_idx RENAME TO {p}log_whole_xid_idx;
ALTER INDEX {p}log_created_idx RENAME TO {p}log_whole_created_idx;
CREATE TABLE {p}log (LIKE {p}log_whole INCLUDING ALL) PARTITION BY RANGE (seq);
DROP TABLE {p}log_whole;
ALTER INDEX {p}log_created_at_idx RENAME TO {p}log_created_idx;
CREATE TABLE {p}log_default PARTITION OF {p}log DEFAULT;
CREATE TRIGGER {p}log_rules_update BEFORE UPDATE OF id, topic, key, payload, headers, partition ON {p}log
    FOR EACH ROW EXECUTE FUNCTION {p}outbox_rules();
CREATE TABLE {p}log_chunks (
    lo         bigint      PRIMARY KEY,
    hi         bigint      NOT NULL,
    sealed_xid xid8,
    sealed_at  timestamptz
);`, "{p}", prefix)
}

// ErrSequenceCached is returned by the chunks' maintenance when the
// outbox's sequence caches values: a chunk's seal could then miss a
// writer holding a value below its end.
var ErrSequenceCached = errors.New("postbox: the log's chunks need the outbox sequence's cache at 1")

// seqLastSQL is the last value the outbox's sequence has handed out (0
// before the first): values are handed out in order (its cache is 1), so
// every value up to it has been drawn.
const seqLastSQL = `(SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {p}outbox_seq_seq)`

// chunkTable is the name of the chunk starting at lo.
func (s *logStore[T]) chunkTable(lo int64) string { return fmt.Sprintf("%slog_c%d", s.prefix, lo) }

// inChunkTx runs f in a transaction that holds the chunks' advisory lock,
// so that two processes' passes do not attach or drop the same chunk; it
// reports false when another pass holds it. Locks are waited for only
// chunkLockTimeout, and the commit does not wait for a flush: lost in a
// crash, an attach or a drop is done again by the next pass.
func (s *logStore[T]) inChunkTx(ctx context.Context, f func(tx pgx.Tx) error) (bool, error) {
	held := false
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, s.prefix+"log_chunks").Scan(&held); err != nil || !held {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true)`, chunkLockTimeout); err != nil {
			return err
		}
		return f(tx)
	})
	return held, err
}

// lockBusy reports whether err is a lock wait that gave up
// (lock_timeout): the next pass tries again.
func lockBusy(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// maintainChunks attaches the chunks the sequence reaches next, seals
// those it has passed, and drops those retention has passed (age), and
// returns how many rows the dropped chunks held. A chunk whose lock is
// not granted soon is left to the next pass.
func (s *logStore[T]) maintainChunks(ctx context.Context, age time.Duration) (int, error) {
	if err := s.attachChunks(ctx); err != nil {
		return 0, err
	}
	if err := s.sealChunks(ctx); err != nil {
		return 0, err
	}
	var los []int64
	rs, err := s.db.Query(ctx, s.droppable, age.Milliseconds())
	if err == nil {
		los, err = pgx.CollectRows(rs, pgx.RowTo[int64])
	}
	if err != nil {
		return 0, err
	}
	dropped := 0
	for _, lo := range los {
		var n int
		held, err := s.inChunkTx(ctx, func(tx pgx.Tx) error {
			// DROP TABLE would take the same lock, after the count.
			if _, err := tx.Exec(ctx, s.r.Replace(`LOCK TABLE {p}log IN ACCESS EXCLUSIVE MODE`)); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+s.chunkTable(lo)).Scan(&n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `DROP TABLE `+s.chunkTable(lo)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, s.r.Replace(`WITH c AS (DELETE FROM {p}log_chunks WHERE lo = $1 RETURNING lo, hi)
DELETE FROM {p}log_done m USING c WHERE m.seq >= c.lo AND m.seq < c.hi`), lo)
			return err
		})
		switch {
		case lockBusy(err) || err == nil && !held:
			return dropped, nil
		case err != nil:
			return dropped, err
		}
		dropped += n
	}
	return dropped, nil
}

// attachChunks attaches chunks until ahead of them lie beyond the
// sequence's last value. A chunk starts where the last one ends, or just
// above the sequence when the sequence has outrun them (or at the first
// pass): the rows between stay in the default partition.
//
// The attach first locks the log whole (ACCESS EXCLUSIVE), and so waits
// for every statement on it, and every transaction that has written to
// it, to end; ATTACH PARTITION alone would take only SHARE UPDATE
// EXCLUSIVE, which neither readers nor writers conflict with, and both
// then go wrong:
//
//   - an insert whose statement began before the attach committed routes
//     a row of the new chunk's range to the default partition, waits
//     there for the attach's lock, and then fails the default partition's
//     new constraint;
//   - a relay's read planned before the attach committed does not scan
//     the new chunk, though its snapshot, taken after planning, sees rows
//     committed there since: its position then passes rows it never read
//     (the conformance suite's rolling restart caught it, a key's message
//     published before the one due).
//
// Under the lock no statement on the log is in flight, and the next ones
// are planned after the attach commits. No seq is drawn meanwhile either,
// so the chunks can start just above the sequence as the attach reads it.
// Readers and writers wait for the attach, a few milliseconds once a
// chunk's width, and at most chunkLockTimeout behind a long statement or
// writer, after which the attach gives up until the next pass.
func (s *logStore[T]) attachChunks(ctx context.Context) error {
	const read = `SELECT ` + seqLastSQL + `, coalesce((SELECT max(hi) FROM {p}log_chunks), 0)`
	w, ahead := s.chunks.width, int64(s.chunks.ahead)
	var last, top int64
	if err := s.pool.QueryRow(ctx, s.r.Replace(read)).Scan(&last, &top); err != nil || top >= last+1+ahead*w {
		return err
	}
	_, err := s.inChunkTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.r.Replace(`LOCK TABLE {p}log IN ACCESS EXCLUSIVE MODE`)); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, s.r.Replace(read)).Scan(&last, &top); err != nil {
			return err
		}
		for lo := max(top, last+1); lo < last+1+ahead*w; lo += w {
			t := s.chunkTable(lo)
			for _, q := range []string{
				`CREATE TABLE ` + t + ` (LIKE ` + s.prefix + `log INCLUDING DEFAULTS)`,
				fmt.Sprintf(`ALTER TABLE %slog ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`, s.prefix, t, lo, lo+w),
				fmt.Sprintf(`INSERT INTO %slog_chunks (lo, hi) VALUES (%d, %d)`, s.prefix, lo, lo+w),
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if lockBusy(err) {
		return nil
	}
	return err
}

// sealChunks seals the chunks the sequence has passed the end of: the
// sequence is read by one statement, and the transaction's id taken by
// the next, so that the id is assigned after every value the read saw
// drawn.
func (s *logStore[T]) sealChunks(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var last int64
		var cache int64
		if err := tx.QueryRow(ctx, s.r.Replace(`SELECT `+seqLastSQL+`,
  (SELECT seqcache FROM pg_sequence WHERE seqrelid = '{p}outbox_seq_seq'::regclass)`)).Scan(&last, &cache); err != nil {
			return err
		}
		if cache != 1 {
			return fmt.Errorf("%w (%soutbox_seq_seq caches %d)", ErrSequenceCached, s.prefix, cache)
		}
		_, err := tx.Exec(ctx, s.r.Replace(`UPDATE {p}log_chunks SET sealed_xid = pg_current_xact_id(), sealed_at = now()
WHERE sealed_xid IS NULL AND hi <= $1 + 1`), last)
		return err
	})
}

// logDroppableSQL lists the chunks retention may drop ($1 the retention
// in milliseconds), oldest first: sealed, every writer of theirs ended
// (the seal below the xmin of the statement's own snapshot), and for
// every partition either its position noted at now − retention had
// passed every writer of the chunk (the seal at or below that position's
// xmin), or the chunk holds no row of it, which is final once every
// writer has ended. No row of a chunk is read but for that probe of the
// primary key, a partition at a time.
var logDroppableSQL = `WITH e AS (SELECT * FROM ` + logPositionsAt("now() - $1 * interval '1 millisecond'") + `)
SELECT c.lo FROM {p}log_chunks c
WHERE c.sealed_xid <= pg_snapshot_xmin(pg_current_snapshot())
  AND NOT EXISTS (
    SELECT 1 FROM {p}positions x LEFT JOIN e ON e.partition = x.partition
    WHERE NOT coalesce(c.sealed_xid <= pg_snapshot_xmin(e.lo), false)
      AND EXISTS (SELECT 1 FROM {p}log g WHERE g.partition = x.partition AND g.seq >= c.lo AND g.seq < c.hi))
ORDER BY c.lo`

// chunkSpanSQL is how long the latest chunk took to fill, by the time
// between the latest two seals; zero while fewer than two are sealed.
const chunkSpanSQL = `SELECT coalesce(extract(epoch FROM max(sealed_at) - min(sealed_at)) * 1000, 0)::bigint
FROM (SELECT sealed_at FROM {p}log_chunks WHERE sealed_at IS NOT NULL ORDER BY lo DESC LIMIT 2) c`

// chunkBound is a FROM item, aliased cb, of the seq below which no row
// can belong to a transaction that had its id when the snapshot lo (an
// expression) was taken or got it later: the end of the last chunk sealed
// at or below lo's xmin. Every seq below that end was drawn before the
// seal read the sequence, so by a writer with an id below the seal's; a
// row of the default partition as well as of a chunk. Chunks are sealed
// in seq order, never with a smaller id than a lower chunk's.
func chunkBound(lo string) string {
	return `(SELECT coalesce(max(c.hi), 0) AS seq FROM {p}log_chunks c
    WHERE c.sealed_xid <= pg_snapshot_xmin(` + lo + `)) cb`
}
