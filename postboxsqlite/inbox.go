package postboxsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

const consumerDeadColumns = `consumer, message_id, topic, coalesce(key, ''), payload, headers, error, attempts, first_failure_at, last_failure_at, dead_at`

// inboxQueries are the consumer side's statements, bound to a prefix once.
type inboxQueries struct {
	insert, insertMany, deleteMany, take, failure, start, crashes, settle, forget, bury, list, get, del, pruneInbox, keep, pruneAttempts, pruneDead,
	requestRequeue, listRequeues, failRequeue string
}

func makeInboxQueries(p string) inboxQueries {
	r := strings.NewReplacer("{p}", p, "{now}", nowExpr, "{dead}", consumerDeadColumns)
	return inboxQueries{
		// A message with a dead message for the consumer is not recorded:
		// a late copy of it runs nothing, and the dead message stands
		// until it is requeued or deleted.
		insert: r.Replace(`INSERT INTO {p}inbox (consumer, message_id)
SELECT ?1, ?2 WHERE NOT EXISTS (SELECT 1 FROM {p}consumer_dead d WHERE d.consumer = ?1 AND d.message_id = ?2)
ON CONFLICT DO NOTHING`),
		// The ids travel as one JSON array; the WHERE clause also keeps
		// SQLite from reading the upsert clause as part of the SELECT.
		insertMany: r.Replace(`INSERT INTO {p}inbox (consumer, message_id)
SELECT ?1, value FROM json_each(?2)
WHERE NOT EXISTS (SELECT 1 FROM {p}consumer_dead d WHERE d.consumer = ?1 AND d.message_id = value)
ORDER BY value
ON CONFLICT DO NOTHING
RETURNING message_id`),
		deleteMany: r.Replace(`DELETE FROM {p}inbox WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2))`),
		take:       r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = ? AND message_id = ? RETURNING {dead}`),
		failure: r.Replace(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error) VALUES (?1, ?2, 1, ?3)
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = attempts + 1, last_failure_at = {now}, last_error = excluded.last_error,
  unsettled_runs = 0
RETURNING attempts, first_failure_at, last_failure_at`),
		// A start refreshes last_failure_at, so that the retention keeps the
		// count of a message that is still being redelivered.
		start: r.Replace(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error, unsettled_runs) VALUES (?1, ?2, 0, '', 1)
ON CONFLICT (consumer, message_id) DO UPDATE SET unsettled_runs = unsettled_runs + 1, last_failure_at = {now}
RETURNING attempts, first_failure_at, last_failure_at, unsettled_runs - 1`),
		settle:  r.Replace(`UPDATE {p}inbox_attempts SET unsettled_runs = unsettled_runs - 1 WHERE consumer = ?1 AND message_id = ?2 AND unsettled_runs > 0`),
		crashes: r.Replace(`SELECT coalesce((SELECT unsettled_runs FROM {p}inbox_attempts WHERE consumer = ?1 AND message_id = ?2), 0)`),
		forget:  r.Replace(`DELETE FROM {p}inbox_attempts WHERE consumer = ? AND message_id = ?`),
		bury: r.Replace(`INSERT INTO {p}consumer_dead (consumer, message_id, topic, key, payload, headers, error, attempts, first_failure_at, last_failure_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (consumer, message_id) DO UPDATE SET topic = excluded.topic, key = excluded.key, payload = excluded.payload,
  headers = excluded.headers, error = excluded.error, attempts = excluded.attempts,
  first_failure_at = excluded.first_failure_at, last_failure_at = excluded.last_failure_at, dead_at = {now}`),
		list: r.Replace(`SELECT {dead} FROM {p}consumer_dead
WHERE (?1 = '' OR consumer = ?1) AND (json_array_length(?2) = 0 OR message_id IN (SELECT value FROM json_each(?2)))
  AND (?3 = '' OR topic = ?3) AND (?4 = '' OR key = ?4)
  AND (?5 IS NULL OR dead_at >= ?5) AND (?6 IS NULL OR dead_at < ?6)
ORDER BY dead_at DESC, consumer, message_id
LIMIT ?7`),
		get: r.Replace(`SELECT {dead} FROM {p}consumer_dead WHERE consumer = ? AND message_id = ?`),
		del: r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = ? AND message_id = ?`),
		pruneInbox: r.Replace(`DELETE FROM {p}inbox WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}inbox WHERE received_at < {now} - ?1
    AND (keep_until IS NULL OR keep_until < {now}) LIMIT ?2)`),
		// Forever is the largest integer; max() of SQLite returns NULL
		// when an argument is NULL, hence the coalesce.
		keep: r.Replace(`UPDATE {p}inbox SET keep_until = CASE WHEN ?3 < 0 THEN 9223372036854775807
  ELSE max(coalesce(keep_until, 0), {now} + ?3) END
WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2))`),
		pruneAttempts: r.Replace(`DELETE FROM {p}inbox_attempts WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}inbox_attempts WHERE last_failure_at < {now} - ?1 LIMIT ?2)`),
		pruneDead: r.Replace(`DELETE FROM {p}consumer_dead WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}consumer_dead WHERE dead_at < {now} - ?1 LIMIT ?2)`),
		requestRequeue: r.Replace(`UPDATE {p}consumer_dead SET requeue_requested_at = coalesce(requeue_requested_at, {now})
WHERE (?1 = '' OR consumer = ?1) AND (json_array_length(?2) = 0 OR message_id IN (SELECT value FROM json_each(?2)))
  AND (?3 = '' OR topic = ?3) AND (?4 = '' OR key = ?4)
  AND (?5 IS NULL OR dead_at >= ?5) AND (?6 IS NULL OR dead_at < ?6)`),
		listRequeues: r.Replace(`SELECT {dead} FROM {p}consumer_dead
WHERE consumer IN (SELECT value FROM json_each(?1)) AND requeue_requested_at IS NOT NULL
ORDER BY requeue_requested_at, consumer, message_id
LIMIT ?2`),
		failRequeue: r.Replace(`UPDATE {p}consumer_dead SET requeue_requested_at = NULL, error = ?3, attempts = attempts + 1, last_failure_at = {now}
WHERE consumer = ?1 AND message_id = ?2`),
	}
}

// InboxInsert implements postboxdriver.Executor. SQLite admits one writer
// at a time, so a copy arriving while the first is uncommitted waits for
// the write lock and then finds the record.
func (s *store) InboxInsert(ctx context.Context, consumer, messageID string) (bool, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.iq.insert, consumer, messageID))
	return n == 1, s.wrap(err)
}

// InboxInsertMany implements postboxdriver.Executor.
func (s *store) InboxInsertMany(ctx context.Context, consumer string, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return []bool{}, nil
	}
	inserted, err := sqlkit.QueryAll(ctx, s.conn(), s.iq.insertMany, []any{consumer, sqlkit.Strings(ids)}, sqlkit.ScanString)
	if err != nil {
		return nil, s.wrap(err)
	}
	return postboxdriver.Fresh(ids, inserted), nil
}

// InboxDelete implements postboxdriver.Executor.
func (s *store) InboxDelete(ctx context.Context, consumer string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	_, err := s.conn().ExecContext(ctx, s.iq.deleteMany, consumer, sqlkit.Strings(ids))
	return s.wrap(err)
}

// RecordFailure implements postboxdriver.Executor.
func (s *store) RecordFailure(ctx context.Context, consumer, messageID, errText string) (postboxdriver.Attempts, error) {
	a, err := sqlkit.ScanAttempts(s.conn().QueryRowContext(ctx, s.iq.failure, consumer, messageID, errText))
	return a, s.wrap(err)
}

// InboxStart implements postboxdriver.Executor.
func (s *store) InboxStart(ctx context.Context, consumer, messageID string) (postboxdriver.Attempts, error) {
	var crashes int
	a, err := sqlkit.ScanAttempts(s.conn().QueryRowContext(ctx, s.iq.start, consumer, messageID), &crashes)
	a.Crashes = crashes
	return a, s.wrap(err)
}

// InboxCrashes implements postboxdriver.Executor.
func (s *store) InboxCrashes(ctx context.Context, consumer, messageID string) (int, error) {
	var n int
	err := s.conn().QueryRowContext(ctx, s.iq.crashes, consumer, messageID).Scan(&n)
	return n, s.wrap(err)
}

// InboxSettle implements postboxdriver.Executor.
func (s *store) InboxSettle(ctx context.Context, consumer, messageID string) error {
	_, err := s.conn().ExecContext(ctx, s.iq.settle, consumer, messageID)
	return s.wrap(err)
}

// PruneInbox implements postboxdriver.Executor: one bounded batch.
func (s *store) PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int64
	err := s.write(ctx, func(c conn) error {
		var err error
		if n, err = sqlkit.Affected(c.ExecContext(ctx, s.iq.pruneInbox, age.Milliseconds(), limit)); err != nil {
			return err
		}
		_, err = c.ExecContext(ctx, s.iq.pruneAttempts, age.Milliseconds(), limit)
		return err
	})
	return int(n), err
}

// InboxKeep implements postboxdriver.Executor.
func (s *store) InboxKeep(ctx context.Context, consumer string, ids []string, keep time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	ms := keep.Milliseconds()
	if keep < 0 {
		ms = -1
	}
	_, err := s.conn().ExecContext(ctx, s.iq.keep, consumer, sqlkit.Strings(ids), ms)
	return s.wrap(err)
}

// BuryConsumerDead implements postboxdriver.Executor.
func (s *store) BuryConsumerDead(ctx context.Context, d postboxdriver.DeadMessage) error {
	return s.write(ctx, func(c conn) error {
		if _, err := c.ExecContext(ctx, s.iq.forget, d.Consumer, d.ID); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, s.iq.bury, sqlkit.BuryArgs(d)...)
		return err
	})
}

// ListConsumerDead implements postboxdriver.Executor.
func (s *store) ListConsumerDead(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.iq.list, append(sqlkit.ConsumerDeadFilterArgs(f), sqlkit.LimitOr100(f.Limit)),
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanConsumerDead(r) })
	return out, s.wrap(err)
}

// GetConsumerDead implements postboxdriver.Executor.
func (s *store) GetConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	d, err := sqlkit.ScanConsumerDead(s.conn().QueryRowContext(ctx, s.iq.get, consumer, messageID))
	return d, s.notFound(err)
}

// TakeConsumerDead implements postboxdriver.Executor.
func (s *store) TakeConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	d, err := sqlkit.ScanConsumerDead(s.conn().QueryRowContext(ctx, s.iq.take, consumer, messageID))
	return d, s.notFound(err)
}

// DeleteConsumerDead implements postboxdriver.Executor.
func (s *store) DeleteConsumerDead(ctx context.Context, consumer, messageID string) (bool, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.iq.del, consumer, messageID))
	return n == 1, s.wrap(err)
}

// PruneConsumerDead implements postboxdriver.Executor.
func (s *store) PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.iq.pruneDead, age.Milliseconds(), limit))
	return int(n), s.wrap(err)
}

// RequestConsumerRequeue implements postboxdriver.Executor.
func (s *store) RequestConsumerRequeue(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.iq.requestRequeue, sqlkit.ConsumerDeadFilterArgs(f)...))
	return int(n), s.wrap(err)
}

// ListConsumerRequeues implements postboxdriver.Executor.
func (s *store) ListConsumerRequeues(ctx context.Context, consumers []string, limit int) ([]postboxdriver.DeadMessage, error) {
	if len(consumers) == 0 {
		return nil, nil
	}
	out, err := sqlkit.QueryAll(ctx, s.conn(), s.iq.listRequeues, []any{sqlkit.Strings(consumers), sqlkit.LimitOr100(limit)},
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanConsumerDead(r) })
	return out, s.wrap(err)
}

// FailConsumerRequeue implements postboxdriver.Executor.
func (s *store) FailConsumerRequeue(ctx context.Context, consumer, messageID, errText string) (bool, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.iq.failRequeue, consumer, messageID, errText))
	return n == 1, s.wrap(err)
}

// Savepoint implements postboxdriver.Executor. On the pool it is
// refused: SQLite would take a SAVEPOINT outside a transaction as the
// start of one, left open on a pooled connection.
func (s *store) Savepoint(ctx context.Context, name string) error {
	return sqlkit.Savepoint(ctx, s.tx, "SAVEPOINT ", name)
}

// RollbackToSavepoint implements postboxdriver.Executor.
func (s *store) RollbackToSavepoint(ctx context.Context, name string) error {
	return sqlkit.Savepoint(ctx, s.tx, "ROLLBACK TO SAVEPOINT ", name)
}

// ReleaseSavepoint implements postboxdriver.Executor.
func (s *store) ReleaseSavepoint(ctx context.Context, name string) error {
	return sqlkit.Savepoint(ctx, s.tx, "RELEASE SAVEPOINT ", name)
}

// OldestSnapshot implements postboxdriver.Executor. A SQLite reader holds
// no horizon that makes the relay's reads slower: there is nothing to
// report.
func (s *store) OldestSnapshot(context.Context) (postboxdriver.Snapshot, bool, error) {
	return postboxdriver.Snapshot{}, false, nil
}

// CheckConnections implements postboxdriver.Executor: SQLite has no
// pooler in front of it.
func (s *store) CheckConnections(context.Context) error { return nil }

// DurabilityWarnings implements postboxdriver.Executor. The setting
// belongs to each connection; the one the pool hands out here stands for
// the DSN they all share.
func (s *store) DurabilityWarnings(ctx context.Context) ([]string, error) {
	var level int
	if err := s.conn().QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&level); err != nil {
		return nil, s.wrap(err)
	}
	if level < 2 {
		return []string{fmt.Sprintf("SQLite runs with synchronous=%d (below FULL): a power loss can undo transactions that committed, after the relay published their messages; open it with postboxsqlite.Open or DSN", level)}, nil
	}
	return nil, nil
}
