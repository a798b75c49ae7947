package pgsql

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

type inboxQueries struct {
	insert, insertMany, delete, recordFailure, start, crashes, settle, bury, listDead, getDead, takeDead, deleteDead,
	pruneInbox, keep, pruneDead, requestRequeue, listRequeues, failRequeue string
}

const consumerDeadColumns = `consumer, message_id, topic, coalesce(key, ''), payload, headers::text, error, attempts, first_failure_at, last_failure_at, dead_at`

func makeInboxQueries(prefix string) inboxQueries {
	r := strings.NewReplacer("{p}", prefix)
	return inboxQueries{
		// A message with a dead message for the consumer is not recorded:
		// a late copy of it runs nothing, and the dead message stands
		// until it is requeued or deleted.
		insert: r.Replace(`WITH ins AS (
  INSERT INTO {p}inbox (consumer, message_id)
  SELECT $1::text, $2::text
  WHERE NOT EXISTS (SELECT 1 FROM {p}consumer_dead d WHERE d.consumer = $1::text AND d.message_id = $2::text)
  ON CONFLICT DO NOTHING RETURNING 1
) SELECT count(*) FROM ins`),
		insertMany: r.Replace(`INSERT INTO {p}inbox (consumer, message_id)
SELECT $1, id FROM unnest($2::text[]) AS u(id)
WHERE NOT EXISTS (SELECT 1 FROM {p}consumer_dead d WHERE d.consumer = $1 AND d.message_id = u.id)
ORDER BY id COLLATE "C"
ON CONFLICT DO NOTHING
RETURNING message_id`),
		delete: r.Replace(`DELETE FROM {p}inbox WHERE consumer = $1 AND message_id = ANY($2::text[])`),
		recordFailure: r.Replace(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error) VALUES ($1, $2, 1, $3)
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = {p}inbox_attempts.attempts + 1, last_failure_at = now(), last_error = EXCLUDED.last_error,
  unsettled_runs = 0
RETURNING attempts, first_failure_at, last_failure_at`),
		// A start refreshes last_failure_at, so that the retention keeps the
		// count of a message that is still being redelivered.
		start: r.Replace(`INSERT INTO {p}inbox_attempts AS a (consumer, message_id, attempts, last_error, unsettled_runs) VALUES ($1, $2, 0, '', 1)
ON CONFLICT (consumer, message_id) DO UPDATE SET unsettled_runs = a.unsettled_runs + 1, last_failure_at = now()
RETURNING attempts, first_failure_at, last_failure_at, unsettled_runs - 1`),
		settle:  r.Replace(`UPDATE {p}inbox_attempts SET unsettled_runs = unsettled_runs - 1 WHERE consumer = $1 AND message_id = $2 AND unsettled_runs > 0`),
		crashes: r.Replace(`SELECT coalesce((SELECT unsettled_runs FROM {p}inbox_attempts WHERE consumer = $1 AND message_id = $2), 0)`),
		bury: r.Replace(`WITH gone AS (
  DELETE FROM {p}inbox_attempts WHERE consumer = $1 AND message_id = $2
)
INSERT INTO {p}consumer_dead (consumer, message_id, topic, key, payload, headers, error, attempts, first_failure_at, last_failure_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10)
ON CONFLICT (consumer, message_id) DO UPDATE SET topic = EXCLUDED.topic, key = EXCLUDED.key, payload = EXCLUDED.payload,
  headers = EXCLUDED.headers, error = EXCLUDED.error, attempts = EXCLUDED.attempts,
  first_failure_at = EXCLUDED.first_failure_at, last_failure_at = EXCLUDED.last_failure_at, dead_at = now()`),
		listDead: r.Replace(`SELECT ` + consumerDeadColumns + ` FROM {p}consumer_dead
WHERE ($1 = '' OR consumer = $1) AND (cardinality($2::text[]) = 0 OR message_id = ANY($2::text[]))
  AND ($3 = '' OR topic = $3) AND ($4 = '' OR key = $4)
  AND ($5::timestamptz IS NULL OR dead_at >= $5) AND ($6::timestamptz IS NULL OR dead_at < $6)
ORDER BY dead_at DESC, consumer, message_id
LIMIT $7`),
		getDead:    r.Replace(`SELECT ` + consumerDeadColumns + ` FROM {p}consumer_dead WHERE consumer = $1 AND message_id = $2`),
		takeDead:   r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = $1 AND message_id = $2 RETURNING ` + consumerDeadColumns),
		deleteDead: r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = $1 AND message_id = $2`),
		// Each call deletes one bounded batch, so it never holds many locks
		// or a long transaction.
		pruneInbox: r.Replace(`WITH old AS (
  SELECT consumer, message_id FROM {p}inbox WHERE received_at < now() - $1 * interval '1 millisecond'
    AND (keep_until IS NULL OR keep_until < now()) LIMIT $2
), del AS (
  DELETE FROM {p}inbox i USING old WHERE i.consumer = old.consumer AND i.message_id = old.message_id RETURNING 1
), stale AS (
  DELETE FROM {p}inbox_attempts a WHERE (a.consumer, a.message_id) IN (
    SELECT consumer, message_id FROM {p}inbox_attempts WHERE last_failure_at < now() - $1 * interval '1 millisecond' LIMIT $2)
)
SELECT count(*) FROM del`),
		// greatest ignores a NULL: the first hold sets the column.
		keep: r.Replace(`UPDATE {p}inbox SET keep_until = CASE WHEN $3::bigint < 0 THEN 'infinity'::timestamptz
  ELSE greatest(keep_until, now() + $3::bigint * interval '1 millisecond') END
WHERE consumer = $1 AND message_id = ANY($2::text[]) AND keep_until IS DISTINCT FROM 'infinity'::timestamptz`),
		requestRequeue: r.Replace(`WITH marked AS (
  UPDATE {p}consumer_dead SET requeue_requested_at = coalesce(requeue_requested_at, now())
  WHERE ($1 = '' OR consumer = $1) AND (cardinality($2::text[]) = 0 OR message_id = ANY($2::text[]))
    AND ($3 = '' OR topic = $3) AND ($4 = '' OR key = $4)
    AND ($5::timestamptz IS NULL OR dead_at >= $5) AND ($6::timestamptz IS NULL OR dead_at < $6)
  RETURNING 1
) SELECT count(*) FROM marked`),
		listRequeues: r.Replace(`SELECT ` + consumerDeadColumns + ` FROM {p}consumer_dead
WHERE consumer = ANY($1::text[]) AND requeue_requested_at IS NOT NULL
ORDER BY requeue_requested_at, consumer, message_id
LIMIT $2`),
		failRequeue: r.Replace(`UPDATE {p}consumer_dead SET requeue_requested_at = NULL, error = $3, attempts = attempts + 1, last_failure_at = now()
WHERE consumer = $1 AND message_id = $2`),
		pruneDead: r.Replace(`WITH del AS (
  DELETE FROM {p}consumer_dead d WHERE (d.consumer, d.message_id) IN (
    SELECT consumer, message_id FROM {p}consumer_dead WHERE dead_at < now() - $1 * interval '1 millisecond' LIMIT $2)
  RETURNING 1
) SELECT count(*) FROM del`),
	}
}

func scanConsumerDead(r Rows) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	var headers string
	err := r.Scan(&d.Consumer, &d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Error, &d.Attempts, &d.FirstFailureAt, &d.LastFailureAt, &d.DeadAt)
	d.Headers = []byte(headers)
	return d, err
}

// InboxInsert implements postboxdriver.Executor.
func (c *Core) InboxInsert(ctx context.Context, consumer, messageID string) (bool, error) {
	n, err := c.count(ctx, c.iq.insert, consumer, messageID)
	return n == 1, err
}

// InboxInsertMany implements postboxdriver.Executor.
func (c *Core) InboxInsertMany(ctx context.Context, consumer string, ids []string) ([]bool, error) {
	if len(ids) == 0 {
		return []bool{}, nil
	}
	inserted, err := queryAll(ctx, c, c.iq.insertMany, []any{consumer, ids}, scanString)
	if err != nil {
		return nil, err
	}
	return postboxdriver.Fresh(ids, inserted), nil
}

// InboxDelete implements postboxdriver.Executor.
func (c *Core) InboxDelete(ctx context.Context, consumer string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids) // the row locks in one order, whoever deletes
	_, err := c.exec(ctx, c.iq.delete, consumer, ids)
	return err
}

// RecordFailure implements postboxdriver.Executor.
func (c *Core) RecordFailure(ctx context.Context, consumer, messageID, errText string) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	err := c.queryRow(ctx, c.db, c.iq.recordFailure, []any{consumer, messageID, errText}, &a.Attempts, &a.FirstFailureAt, &a.LastFailureAt)
	return a, err
}

// InboxStart implements postboxdriver.Executor.
func (c *Core) InboxStart(ctx context.Context, consumer, messageID string) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	err := c.queryRow(ctx, c.db, c.iq.start, []any{consumer, messageID}, &a.Attempts, &a.FirstFailureAt, &a.LastFailureAt, &a.Crashes)
	return a, err
}

// InboxCrashes implements postboxdriver.Executor.
func (c *Core) InboxCrashes(ctx context.Context, consumer, messageID string) (int, error) {
	return c.count(ctx, c.iq.crashes, consumer, messageID)
}

// InboxSettle implements postboxdriver.Executor.
func (c *Core) InboxSettle(ctx context.Context, consumer, messageID string) error {
	_, err := c.exec(ctx, c.iq.settle, consumer, messageID)
	return err
}

// PruneInbox implements postboxdriver.Executor.
func (c *Core) PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error) {
	return c.count(ctx, c.iq.pruneInbox, age.Milliseconds(), limit)
}

// InboxKeep implements postboxdriver.Executor.
func (c *Core) InboxKeep(ctx context.Context, consumer string, ids []string, keep time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Clone(ids)
	slices.Sort(ids) // the row locks in one order, whoever holds
	ms := keep.Milliseconds()
	if keep < 0 {
		ms = -1
	}
	_, err := c.exec(ctx, c.iq.keep, consumer, ids, ms)
	return err
}

// BuryConsumerDead implements postboxdriver.Executor.
func (c *Core) BuryConsumerDead(ctx context.Context, d postboxdriver.DeadMessage) error {
	var key *string
	if d.Key != "" {
		key = &d.Key
	}
	payload, headers := d.Stored()
	_, err := c.exec(ctx, c.iq.bury, d.Consumer, d.ID, d.Topic, key, payload, headers, d.Error, d.Attempts, d.FirstFailureAt, d.LastFailureAt)
	return err
}

// ListConsumerDead implements postboxdriver.Executor.
func (c *Core) ListConsumerDead(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadMessage, error) {
	ids := f.IDs
	if ids == nil {
		ids = []string{}
	}
	return queryAll(ctx, c, c.iq.listDead, []any{f.Consumer, ids, f.Topic, f.Key, timeOrNil(f.Since), timeOrNil(f.Until), limitOr100(f.Limit)}, scanConsumerDead)
}

// GetConsumerDead implements postboxdriver.Executor.
func (c *Core) GetConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	return queryOne(ctx, c, c.iq.getDead, []any{consumer, messageID}, scanConsumerDead)
}

// TakeConsumerDead implements postboxdriver.Executor.
func (c *Core) TakeConsumerDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadMessage, error) {
	return queryOne(ctx, c, c.iq.takeDead, []any{consumer, messageID}, scanConsumerDead)
}

// DeleteConsumerDead implements postboxdriver.Executor.
func (c *Core) DeleteConsumerDead(ctx context.Context, consumer, messageID string) (bool, error) {
	n, err := c.exec(ctx, c.iq.deleteDead, consumer, messageID)
	return n > 0, err
}

// PruneConsumerDead implements postboxdriver.Executor.
func (c *Core) PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error) {
	return c.count(ctx, c.iq.pruneDead, age.Milliseconds(), limit)
}

// RequestConsumerRequeue implements postboxdriver.Executor.
func (c *Core) RequestConsumerRequeue(ctx context.Context, f postboxdriver.DeadFilter) (int, error) {
	ids := f.IDs
	if ids == nil {
		ids = []string{}
	}
	return c.count(ctx, c.iq.requestRequeue, f.Consumer, ids, f.Topic, f.Key, timeOrNil(f.Since), timeOrNil(f.Until))
}

// ListConsumerRequeues implements postboxdriver.Executor.
func (c *Core) ListConsumerRequeues(ctx context.Context, consumers []string, limit int) ([]postboxdriver.DeadMessage, error) {
	if len(consumers) == 0 {
		return nil, nil
	}
	return queryAll(ctx, c, c.iq.listRequeues, []any{consumers, limitOr100(limit)}, scanConsumerDead)
}

// FailConsumerRequeue implements postboxdriver.Executor.
func (c *Core) FailConsumerRequeue(ctx context.Context, consumer, messageID, errText string) (bool, error) {
	n, err := c.exec(ctx, c.iq.failRequeue, consumer, messageID, errText)
	return n > 0, err
}

// Savepoint implements postboxdriver.Executor. The statements carry no
// arguments, so both drivers send them in one round trip each.
func (c *Core) Savepoint(ctx context.Context, name string) error {
	return c.savepoint(ctx, "SAVEPOINT ", name)
}

// RollbackToSavepoint implements postboxdriver.Executor.
func (c *Core) RollbackToSavepoint(ctx context.Context, name string) error {
	return c.savepoint(ctx, "ROLLBACK TO SAVEPOINT ", name)
}

// ReleaseSavepoint implements postboxdriver.Executor.
func (c *Core) ReleaseSavepoint(ctx context.Context, name string) error {
	return c.savepoint(ctx, "RELEASE SAVEPOINT ", name)
}

func (c *Core) savepoint(ctx context.Context, verb, name string) error {
	if !c.inTx {
		return postboxdriver.ErrNotInTx
	}
	if !postboxdriver.ValidSavepointName(name) {
		return fmt.Errorf("postbox: savepoint name %q is not a lower-case SQL identifier", name)
	}
	_, err := c.db.Exec(ctx, verb+name)
	return err
}
