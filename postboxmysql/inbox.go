package postboxmysql

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

const consumerDeadColumns = "consumer, message_id, topic, COALESCE(`key`, ''), payload, headers, error, attempts, first_failure_at, last_failure_at, dead_at"

// inboxQueries are the consumer side's statements, bound to a prefix once.
type inboxQueries struct {
	insertMany, insertOne, take, takeDelete, failure, start, counts, crashes, settle, forget, bury, list, get, del,
	pruneInbox, pruneAttempts, pruneDead, countRequeue, requestRequeue, listRequeues, failRequeue stmt
}

// consumerDeadWhere selects consumer dead messages by ?1 consumer, ?2 ids
// (a JSON array, empty for any), ?3 topic, ?4 key and ?5, ?6 the dead_at
// window (NULL for open).
var consumerDeadWhere = `(?1 = '' OR consumer = ?1) AND (JSON_LENGTH(?2) = 0 OR message_id IN ` + strs(2) + `)
  AND (?3 = '' OR topic = ?3) AND (?4 = '' OR ` + "`key`" + ` = ?4)
  AND (?5 IS NULL OR dead_at >= ?5) AND (?6 IS NULL OR dead_at < ?6)`

func makeInboxQueries(p string) inboxQueries {
	r := strings.NewReplacer("{p}", p, "{now}", nowExpr, "{dead}", consumerDeadColumns)
	q := func(s string) stmt { return prep(r.Replace(s)) }
	return inboxQueries{
		// The ids in order, leaving out those with a dead message for the
		// consumer. At REPEATABLE READ an INSERT ... SELECT reads the dead
		// table with shared locks, so it sees a dead message committed
		// since the transaction's snapshot.
		insertMany: q(`INSERT INTO {p}inbox (consumer, message_id)
SELECT ?1, j.v FROM JSON_TABLE(?2, '$[*]' COLUMNS (v VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j
WHERE NOT EXISTS (SELECT 1 FROM {p}consumer_dead d WHERE d.consumer = ?1 AND d.message_id = j.v)
ORDER BY j.v`),
		insertOne:  q(`INSERT INTO {p}inbox (consumer, message_id) VALUES (?1, ?2)`),
		take:       q(`SELECT {dead} FROM {p}consumer_dead WHERE consumer = ?1 AND message_id = ?2 FOR UPDATE`),
		takeDelete: q(`DELETE FROM {p}consumer_dead WHERE consumer = ?1 AND message_id = ?2`),
		failure: q(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error) VALUES (?1, ?2, 1, ?3)
ON DUPLICATE KEY UPDATE attempts = attempts + 1, last_failure_at = {now}, last_error = VALUES(last_error), unsettled_runs = 0`),
		// A start refreshes last_failure_at, so that the retention keeps the
		// count of a message that is still being redelivered.
		start: q(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error, unsettled_runs) VALUES (?1, ?2, 0, '', 1)
ON DUPLICATE KEY UPDATE unsettled_runs = unsettled_runs + 1, last_failure_at = {now}`),
		counts:  q(`SELECT attempts, first_failure_at, last_failure_at, unsettled_runs FROM {p}inbox_attempts WHERE consumer = ?1 AND message_id = ?2`),
		settle:  q(`UPDATE {p}inbox_attempts SET unsettled_runs = unsettled_runs - 1 WHERE consumer = ?1 AND message_id = ?2 AND unsettled_runs > 0`),
		crashes: q(`SELECT COALESCE((SELECT unsettled_runs FROM {p}inbox_attempts WHERE consumer = ?1 AND message_id = ?2), 0)`),
		forget:  q(`DELETE FROM {p}inbox_attempts WHERE consumer = ?1 AND message_id = ?2`),
		bury: q("INSERT INTO {p}consumer_dead (consumer, message_id, topic, `key`, payload, headers, error, attempts, first_failure_at, last_failure_at)\n" +
			"VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)\n" +
			"ON DUPLICATE KEY UPDATE topic = VALUES(topic), `key` = VALUES(`key`), payload = VALUES(payload),\n" +
			`  headers = VALUES(headers), error = VALUES(error), attempts = VALUES(attempts),
  first_failure_at = VALUES(first_failure_at), last_failure_at = VALUES(last_failure_at), dead_at = {now}`),
		list: q(`SELECT {dead} FROM {p}consumer_dead WHERE ` + consumerDeadWhere + `
ORDER BY dead_at DESC, consumer, message_id
LIMIT ?7`),
		get: q(`SELECT {dead} FROM {p}consumer_dead WHERE consumer = ?1 AND message_id = ?2`),
		del: q(`DELETE FROM {p}consumer_dead WHERE consumer = ?1 AND message_id = ?2`),
		pruneInbox: q(`DELETE FROM {p}inbox WHERE received_at < {now} - ?1
  AND (keep_until IS NULL OR keep_until < {now}) LIMIT ?2`),
		pruneAttempts: q(`DELETE FROM {p}inbox_attempts WHERE last_failure_at < {now} - ?1 LIMIT ?2`),
		pruneDead:     q(`DELETE FROM {p}consumer_dead WHERE dead_at < {now} - ?1 LIMIT ?2`),
		// The rows a request selects, counted: the update changes only
		// those not marked yet, and MySQL reports only the rows it changed.
		countRequeue:   q(`SELECT count(*) FROM {p}consumer_dead WHERE ` + consumerDeadWhere + ` FOR UPDATE`),
		requestRequeue: q(`UPDATE {p}consumer_dead SET requeue_requested_at = COALESCE(requeue_requested_at, {now}) WHERE ` + consumerDeadWhere),
		listRequeues: q(`SELECT {dead} FROM {p}consumer_dead
WHERE consumer IN ` + strs(1) + ` AND requeue_requested_at IS NOT NULL
ORDER BY requeue_requested_at, consumer, message_id
LIMIT ?2`),
		failRequeue: q(`UPDATE {p}consumer_dead SET requeue_requested_at = NULL, error = ?3, attempts = attempts + 1, last_failure_at = {now}
WHERE consumer = ?1 AND message_id = ?2`),
	}
}

// The statements that name rows of the inbox by a list of ids run in the
// handler's transaction, often at REPEATABLE READ, where a statement that
// scans a range locks the gaps between its rows, and two handlers then
// deadlock on each other's inserts. They carry the ids as a list of
// placeholders, which InnoDB looks up one by one, locking only those rows.

// idList returns "(?, ?, ...)" for n ids and the arguments: first, then
// the ids.
func idList(first []any, ids []string) (string, []any) {
	args := append(slices.Clip(first), make([]any, len(ids))...)
	var b strings.Builder
	b.WriteByte('(')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
		args[len(first)+i] = id
	}
	b.WriteByte(')')
	return b.String(), args
}

// A locking read: it sees a dead message committed since the transaction's
// snapshot, as the insert after it would.
func (s *store) deadIDs(ctx context.Context, c conn, consumer string, ids []string) ([]string, error) {
	in, args := idList([]any{consumer}, ids)
	rows, err := c.QueryContext(ctx, `SELECT message_id FROM `+s.prefix+`consumer_dead WHERE consumer = ? AND message_id IN `+in+` LOCK IN SHARE MODE`, args...)
	if err != nil {
		return nil, err
	}
	var out []string
	err = sqlkit.ScanAll(rows, func(r *sql.Rows) error {
		id, err := sqlkit.ScanString(r)
		out = append(out, id)
		return err
	})
	return out, err
}

// InboxInsert implements postboxdriver.Executor.
func (s *store) InboxInsert(ctx context.Context, consumer, messageID string) (bool, error) {
	fresh, err := s.InboxInsertMany(ctx, consumer, []string{messageID})
	if err != nil {
		return false, err
	}
	return fresh[0], nil
}

// InboxInsertMany implements postboxdriver.Executor. One statement
// records the ids that have no dead message, in id order; InnoDB checks a
// duplicate against an uncommitted record by waiting for its transaction,
// so a copy arriving while the first is uncommitted waits for it. When
// every id went in, that is all. Otherwise (some were dead, or a record
// existed, which fails the statement as a whole and only the statement),
// the dead ones are read, and, after a duplicate, the others go in one at
// a time, each duplicate being a copy.
func (s *store) InboxInsertMany(ctx context.Context, consumer string, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return []bool{}, nil
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	n, err := s.iq.insertMany.exec(ctx, s.conn(), consumer, sqlkit.Strings(sorted))
	switch {
	case err == nil && int(n) == len(ids):
		return postboxdriver.Fresh(ids, sorted), nil
	case err != nil && errNumber(err) != errDupEntry:
		return nil, s.wrap(err)
	}
	duplicate := err != nil
	var inserted []string
	err = s.write(ctx, func(c conn) error {
		inserted = inserted[:0]
		dead, err := s.deadIDs(ctx, c, consumer, ids)
		if err != nil {
			return err
		}
		for _, id := range sorted {
			switch {
			case slices.Contains(dead, id):
			case !duplicate:
				// The statement above recorded every id but the dead ones.
				inserted = append(inserted, id)
			default:
				_, err := s.iq.insertOne.exec(ctx, c, consumer, id)
				switch {
				case err == nil:
					inserted = append(inserted, id)
				case errNumber(err) != errDupEntry:
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
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
	in, args := idList([]any{consumer}, ids)
	_, err := s.conn().ExecContext(ctx, `DELETE FROM `+s.prefix+`inbox WHERE consumer = ? AND message_id IN `+in, args...)
	return s.wrap(err)
}

// counted runs an upsert of a message's attempts and reads the counts
// back, in one transaction: MySQL has no RETURNING.
func (s *store) counted(ctx context.Context, upsert stmt, args ...any) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	err := s.write(ctx, func(c conn) error {
		if _, err := upsert.exec(ctx, c, args...); err != nil {
			return err
		}
		var crashes int
		var err error
		a, err = sqlkit.ScanAttempts(s.iq.counts.row(ctx, c, args[0], args[1]), &crashes)
		a.Crashes = crashes
		return err
	})
	return a, err
}

// RecordFailure implements postboxdriver.Executor.
func (s *store) RecordFailure(ctx context.Context, consumer, messageID, errText string) (postboxdriver.Attempts, error) {
	a, err := s.counted(ctx, s.iq.failure, consumer, messageID, errText)
	a.Crashes = 0
	return a, err
}

// InboxStart implements postboxdriver.Executor: the counts as they stood
// before this run.
func (s *store) InboxStart(ctx context.Context, consumer, messageID string) (postboxdriver.Attempts, error) {
	a, err := s.counted(ctx, s.iq.start, consumer, messageID)
	a.Crashes--
	return a, err
}

// InboxCrashes implements postboxdriver.Executor.
func (s *store) InboxCrashes(ctx context.Context, consumer, messageID string) (int, error) {
	var n int
	err := s.iq.crashes.row(ctx, s.conn(), consumer, messageID).Scan(&n)
	return n, s.wrap(err)
}

// InboxSettle implements postboxdriver.Executor.
func (s *store) InboxSettle(ctx context.Context, consumer, messageID string) error {
	_, err := s.iq.settle.exec(ctx, s.conn(), consumer, messageID)
	return s.wrap(err)
}

// PruneInbox implements postboxdriver.Executor: one bounded batch.
func (s *store) PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int64
	err := s.write(ctx, func(c conn) error {
		var err error
		if n, err = s.iq.pruneInbox.exec(ctx, c, age.Milliseconds(), limit); err != nil {
			return err
		}
		_, err = s.iq.pruneAttempts.exec(ctx, c, age.Milliseconds(), limit)
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
	// Forever is the largest BIGINT.
	in, args := idList([]any{ms, ms, consumer}, ids)
	_, err := s.conn().ExecContext(ctx, `UPDATE `+s.prefix+`inbox
SET keep_until = CASE WHEN ? < 0 THEN 9223372036854775807 ELSE GREATEST(COALESCE(keep_until, 0), `+nowExpr+` + ?) END
WHERE consumer = ? AND message_id IN `+in, args...)
	return s.wrap(err)
}

// BuryConsumerDead implements postboxdriver.Executor.
func (s *store) BuryConsumerDead(ctx context.Context, d postboxdriver.DeadMessage) error {
	return s.write(ctx, func(c conn) error {
		if _, err := s.iq.forget.exec(ctx, c, d.Consumer, d.ID); err != nil {
			return err
		}
		_, err := s.iq.bury.exec(ctx, c, sqlkit.BuryArgs(d)...)
		return err
	})
}

// ListConsumerDead implements postboxdriver.Executor.
func (s *store) ListConsumerDead(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	out, err := query(ctx, s.conn(), s.iq.list, append(sqlkit.ConsumerDeadFilterArgs(f), sqlkit.LimitOr100(f.Limit)),
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanConsumerDead(r) })
	return out, s.wrap(err)
}

// GetConsumerDead implements postboxdriver.Executor.
func (s *store) GetConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	d, err := sqlkit.ScanConsumerDead(s.iq.get.row(ctx, s.conn(), consumer, messageID))
	return d, s.notFound(err)
}

// TakeConsumerDead implements postboxdriver.Executor.
func (s *store) TakeConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	err := s.write(ctx, func(c conn) error {
		var err error
		if d, err = sqlkit.ScanConsumerDead(s.iq.take.row(ctx, c, consumer, messageID)); err != nil {
			return err
		}
		_, err = s.iq.takeDelete.exec(ctx, c, consumer, messageID)
		return err
	})
	return d, s.notFound(err)
}

// DeleteConsumerDead implements postboxdriver.Executor.
func (s *store) DeleteConsumerDead(ctx context.Context, consumer, messageID string) (bool, error) {
	n, err := s.iq.del.exec(ctx, s.conn(), consumer, messageID)
	return n == 1, s.wrap(err)
}

// PruneConsumerDead implements postboxdriver.Executor.
func (s *store) PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error) {
	n, err := s.iq.pruneDead.exec(ctx, s.conn(), age.Milliseconds(), limit)
	return int(n), s.wrap(err)
}

// RequestConsumerRequeue implements postboxdriver.Executor.
func (s *store) RequestConsumerRequeue(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	args := sqlkit.ConsumerDeadFilterArgs(f)
	var n int
	err := s.write(ctx, func(c conn) error {
		if err := s.iq.countRequeue.row(ctx, c, args...).Scan(&n); err != nil {
			return err
		}
		_, err := s.iq.requestRequeue.exec(ctx, c, args...)
		return err
	})
	return n, err
}

// ListConsumerRequeues implements postboxdriver.Executor.
func (s *store) ListConsumerRequeues(ctx context.Context, consumers []string, limit int) ([]postboxdriver.DeadMessage, error) {
	if len(consumers) == 0 {
		return nil, nil
	}
	out, err := query(ctx, s.conn(), s.iq.listRequeues, []any{sqlkit.Strings(consumers), sqlkit.LimitOr100(limit)},
		func(r *sql.Rows) (postboxdriver.DeadMessage, error) { return sqlkit.ScanConsumerDead(r) })
	return out, s.wrap(err)
}

// FailConsumerRequeue implements postboxdriver.Executor.
func (s *store) FailConsumerRequeue(ctx context.Context, consumer, messageID, errText string) (bool, error) {
	n, err := s.iq.failRequeue.exec(ctx, s.conn(), consumer, messageID, errText)
	return n == 1, s.wrap(err)
}

// Savepoint implements postboxdriver.Executor. On the pool it is
// refused: in autocommit mode a savepoint ends with its statement.
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
