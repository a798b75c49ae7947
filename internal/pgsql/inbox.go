package pgsql

import (
	"context"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

const deadColumns = `consumer, message_id, topic, coalesce(key, ''), payload, headers::text, error, attempts, first_failure_at, last_failure_at, dead_at`

func scanDead(r Rows) (postboxdriver.DeadLetter, error) {
	var d postboxdriver.DeadLetter
	var headers string
	err := r.Scan(&d.Consumer, &d.MessageID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Error, &d.Attempts, &d.FirstFailureAt, &d.LastFailureAt, &d.DeadAt)
	d.Headers = []byte(headers)
	return d, err
}

// InboxInsert records (consumer, messageID) in q's transaction.
func (c *Core) InboxInsert(ctx context.Context, q Querier, consumer, messageID string) (bool, error) {
	var inserted bool
	err := c.queryRow(ctx, q, `WITH ins AS (
  INSERT INTO `+c.prefix+`inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1
) SELECT EXISTS (SELECT 1 FROM ins)`, []any{consumer, messageID}, &inserted)
	return inserted, err
}

// TakeDead deletes and returns a dead letter in q's transaction.
func (c *Core) TakeDead(ctx context.Context, q Querier, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	return c.oneDead(ctx, q, `DELETE FROM `+c.prefix+`consumer_dead WHERE consumer = $1 AND message_id = $2 RETURNING `+deadColumns, consumer, messageID)
}

func (c *Core) oneDead(ctx context.Context, q Querier, sql string, args ...any) (postboxdriver.DeadLetter, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return postboxdriver.DeadLetter{}, c.wrap(err)
	}
	var d postboxdriver.DeadLetter
	found := false
	err = scanAll(rows, func(r Rows) error {
		found = true
		var err error
		d, err = scanDead(r)
		return err
	})
	if err == nil && !found {
		err = postboxdriver.ErrNotFound
	}
	return d, c.wrap(err)
}

// RecordFailure implements postboxdriver.InboxExecutor.
func (c *Core) RecordFailure(ctx context.Context, consumer, messageID, errText string) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	err := c.queryRow(ctx, c.db, `INSERT INTO `+c.prefix+`inbox_attempts (consumer, message_id, attempts, last_error) VALUES ($1, $2, 1, $3)
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = `+c.prefix+`inbox_attempts.attempts + 1, last_failure_at = now(), last_error = EXCLUDED.last_error
RETURNING attempts, first_failure_at, last_failure_at`, []any{consumer, messageID, errText}, &a.Attempts, &a.FirstFailureAt, &a.LastFailureAt)
	return a, err
}

// Bury implements postboxdriver.InboxExecutor.
func (c *Core) Bury(ctx context.Context, d postboxdriver.DeadLetter) error {
	var key *string
	if d.Key != "" {
		key = &d.Key
	}
	headers := string(d.Headers)
	if headers == "" {
		headers = "{}"
	}
	payload := d.Payload
	if payload == nil {
		payload = []byte{}
	}
	return c.wrap(c.db.Exec(ctx, `WITH gone AS (
  DELETE FROM `+c.prefix+`inbox_attempts WHERE consumer = $1 AND message_id = $2
)
INSERT INTO `+c.prefix+`consumer_dead (consumer, message_id, topic, key, payload, headers, error, attempts, first_failure_at, last_failure_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10)
ON CONFLICT (consumer, message_id) DO UPDATE SET topic = EXCLUDED.topic, key = EXCLUDED.key, payload = EXCLUDED.payload,
  headers = EXCLUDED.headers, error = EXCLUDED.error, attempts = EXCLUDED.attempts,
  first_failure_at = EXCLUDED.first_failure_at, last_failure_at = EXCLUDED.last_failure_at, dead_at = now()`,
		d.Consumer, d.MessageID, d.Topic, key, payload, headers, d.Error, d.Attempts, d.FirstFailureAt, d.LastFailureAt))
}

// ListDead implements postboxdriver.InboxExecutor.
func (c *Core) ListDead(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	rows, err := c.db.Query(ctx, `SELECT `+deadColumns+` FROM `+c.prefix+`consumer_dead
WHERE ($1 = '' OR consumer = $1) AND ($2 = '' OR topic = $2)
  AND ($3::timestamptz IS NULL OR dead_at >= $3) AND ($4::timestamptz IS NULL OR dead_at < $4)
ORDER BY dead_at DESC, consumer, message_id
LIMIT $5`, f.Consumer, f.Topic, since, until, limit)
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []postboxdriver.DeadLetter
	err = scanAll(rows, func(r Rows) error {
		d, err := scanDead(r)
		out = append(out, d)
		return err
	})
	return out, c.wrap(err)
}

// GetDead implements postboxdriver.InboxExecutor.
func (c *Core) GetDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	return c.oneDead(ctx, c.db, `SELECT `+deadColumns+` FROM `+c.prefix+`consumer_dead WHERE consumer = $1 AND message_id = $2`, consumer, messageID)
}

// DeleteDead implements postboxdriver.InboxExecutor.
func (c *Core) DeleteDead(ctx context.Context, consumer, messageID string) (bool, error) {
	var deleted bool
	err := c.queryRow(ctx, c.db, `WITH del AS (
  DELETE FROM `+c.prefix+`consumer_dead WHERE consumer = $1 AND message_id = $2 RETURNING 1
) SELECT EXISTS (SELECT 1 FROM del)`, []any{consumer, messageID}, &deleted)
	return deleted, err
}

// PruneInbox implements postboxdriver.InboxExecutor. Each call deletes one
// bounded batch, so it never holds many locks or a long transaction.
func (c *Core) PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, `WITH old AS (
  SELECT consumer, message_id FROM `+c.prefix+`inbox WHERE received_at < now() - $1 * interval '1 millisecond' LIMIT $2
), del AS (
  DELETE FROM `+c.prefix+`inbox i USING old WHERE i.consumer = old.consumer AND i.message_id = old.message_id RETURNING 1
), stale AS (
  DELETE FROM `+c.prefix+`inbox_attempts a WHERE (a.consumer, a.message_id) IN (
    SELECT consumer, message_id FROM `+c.prefix+`inbox_attempts WHERE last_failure_at < now() - $1 * interval '1 millisecond' LIMIT $2)
)
SELECT count(*) FROM del`, []any{age.Milliseconds(), limit}, &n)
	return n, err
}

// PruneConsumerDead implements postboxdriver.InboxExecutor.
func (c *Core) PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, `WITH del AS (
  DELETE FROM `+c.prefix+`consumer_dead d WHERE (d.consumer, d.message_id) IN (
    SELECT consumer, message_id FROM `+c.prefix+`consumer_dead WHERE dead_at < now() - $1 * interval '1 millisecond' LIMIT $2)
  RETURNING 1
) SELECT count(*) FROM del`, []any{age.Milliseconds(), limit}, &n)
	return n, err
}
