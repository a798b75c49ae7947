package postboxsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

var _ postboxdriver.Inboxer[*sql.Tx] = (*store)(nil)

const deadColumns = `consumer, message_id, topic, coalesce(key, ''), payload, headers, error, attempts, first_failure_at, last_failure_at, dead_at`

// inboxQueries are the consumer side's statements, bound to a prefix once.
type inboxQueries struct {
	insert, insertMany, deleteMany, take, failure, forget, bury, list, get, del, pruneInbox, pruneAttempts, pruneDead string
}

func makeInboxQueries(p string) inboxQueries {
	r := strings.NewReplacer("{p}", p, "{now}", nowExpr, "{dead}", deadColumns)
	return inboxQueries{
		insert: r.Replace(`INSERT INTO {p}inbox (consumer, message_id) VALUES (?, ?) ON CONFLICT DO NOTHING`),
		// The ids travel as one JSON array; the WHERE clause keeps SQLite
		// from reading the upsert clause as part of the SELECT.
		insertMany: r.Replace(`INSERT INTO {p}inbox (consumer, message_id)
SELECT ?1, value FROM json_each(?2) WHERE true ORDER BY value
ON CONFLICT DO NOTHING
RETURNING message_id`),
		deleteMany: r.Replace(`DELETE FROM {p}inbox WHERE consumer = ?1 AND message_id IN (SELECT value FROM json_each(?2))`),
		take:       r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = ? AND message_id = ? RETURNING {dead}`),
		failure: r.Replace(`INSERT INTO {p}inbox_attempts (consumer, message_id, attempts, last_error) VALUES (?1, ?2, 1, ?3)
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = attempts + 1, last_failure_at = {now}, last_error = excluded.last_error
RETURNING attempts, first_failure_at, last_failure_at`),
		forget: r.Replace(`DELETE FROM {p}inbox_attempts WHERE consumer = ? AND message_id = ?`),
		bury: r.Replace(`INSERT INTO {p}consumer_dead (consumer, message_id, topic, key, payload, headers, error, attempts, first_failure_at, last_failure_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (consumer, message_id) DO UPDATE SET topic = excluded.topic, key = excluded.key, payload = excluded.payload,
  headers = excluded.headers, error = excluded.error, attempts = excluded.attempts,
  first_failure_at = excluded.first_failure_at, last_failure_at = excluded.last_failure_at, dead_at = {now}`),
		list: r.Replace(`SELECT {dead} FROM {p}consumer_dead
WHERE (?1 = '' OR consumer = ?1) AND (?2 = '' OR topic = ?2)
  AND (?3 IS NULL OR dead_at >= ?3) AND (?4 IS NULL OR dead_at < ?4)
ORDER BY dead_at DESC, consumer, message_id
LIMIT ?5`),
		get: r.Replace(`SELECT {dead} FROM {p}consumer_dead WHERE consumer = ? AND message_id = ?`),
		del: r.Replace(`DELETE FROM {p}consumer_dead WHERE consumer = ? AND message_id = ?`),
		pruneInbox: r.Replace(`DELETE FROM {p}inbox WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}inbox WHERE received_at < {now} - ?1 LIMIT ?2)`),
		pruneAttempts: r.Replace(`DELETE FROM {p}inbox_attempts WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}inbox_attempts WHERE last_failure_at < {now} - ?1 LIMIT ?2)`),
		pruneDead: r.Replace(`DELETE FROM {p}consumer_dead WHERE (consumer, message_id) IN (
  SELECT consumer, message_id FROM {p}consumer_dead WHERE dead_at < {now} - ?1 LIMIT ?2)`),
	}
}

type scanner interface{ Scan(dest ...any) error }

func scanDead(r scanner) (postboxdriver.DeadLetter, error) {
	var d postboxdriver.DeadLetter
	var headers string
	var first, last, dead int64
	err := r.Scan(&d.Consumer, &d.MessageID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Error, &d.Attempts, &first, &last, &dead)
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	d.Headers = []byte(headers)
	d.FirstFailureAt, d.LastFailureAt, d.DeadAt = time.UnixMilli(first), time.UnixMilli(last), time.UnixMilli(dead)
	return d, err
}

// InboxInsertTx implements postboxdriver.Inboxer. SQLite admits one writer
// at a time, so a copy arriving while the first is uncommitted waits for
// the write lock and then finds the record.
func (s *store) InboxInsertTx(ctx context.Context, tx *sql.Tx, consumer, messageID string) (bool, error) {
	res, err := tx.ExecContext(ctx, s.iq.insert, consumer, messageID)
	if err != nil {
		return false, s.wrap(err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// TakeDeadTx implements postboxdriver.Inboxer.
func (s *store) TakeDeadTx(ctx context.Context, tx *sql.Tx, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	d, err := scanDead(tx.QueryRowContext(ctx, s.iq.take, consumer, messageID))
	return d, s.notFound(err)
}

func (s *store) notFound(err error) error {
	if err == sql.ErrNoRows { //nolint:errorlint // QueryRow returns it unwrapped
		return postboxdriver.ErrNotFound
	}
	return s.wrap(err)
}

// RecordFailure implements postboxdriver.InboxExecutor.
func (s *store) RecordFailure(ctx context.Context, consumer, messageID, errText string) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	var first, last int64
	err := s.db.QueryRowContext(ctx, s.iq.failure, consumer, messageID, errText).Scan(&a.Attempts, &first, &last)
	a.FirstFailureAt, a.LastFailureAt = time.UnixMilli(first), time.UnixMilli(last)
	return a, s.wrap(err)
}

// Bury implements postboxdriver.InboxExecutor.
func (s *store) Bury(ctx context.Context, d postboxdriver.DeadLetter) error {
	var key any
	if d.Key != "" {
		key = d.Key
	}
	headers := string(d.Headers)
	if headers == "" {
		headers = "{}"
	}
	payload := d.Payload
	if payload == nil {
		payload = []byte{}
	}
	return s.write(ctx, func(c *sql.Conn) error {
		if _, err := c.ExecContext(ctx, s.iq.forget, d.Consumer, d.MessageID); err != nil {
			return err
		}
		_, err := c.ExecContext(ctx, s.iq.bury,
			d.Consumer, d.MessageID, d.Topic, key, payload, headers, d.Error, d.Attempts, d.FirstFailureAt.UnixMilli(), d.LastFailureAt.UnixMilli())
		return err
	})
}

// ListDead implements postboxdriver.InboxExecutor.
func (s *store) ListDead(ctx context.Context, f postboxdriver.DeadFilter) ([]postboxdriver.DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var since, until any
	if !f.Since.IsZero() {
		since = f.Since.UnixMilli()
	}
	if !f.Until.IsZero() {
		until = f.Until.UnixMilli()
	}
	rows, err := s.db.QueryContext(ctx, s.iq.list, f.Consumer, f.Topic, since, until, limit)
	if err != nil {
		return nil, s.wrap(err)
	}
	var out []postboxdriver.DeadLetter
	err = scanAll(rows, func(r *sql.Rows) error {
		d, err := scanDead(r)
		out = append(out, d)
		return err
	})
	return out, s.wrap(err)
}

// GetDead implements postboxdriver.InboxExecutor.
func (s *store) GetDead(ctx context.Context, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	d, err := scanDead(s.db.QueryRowContext(ctx, s.iq.get, consumer, messageID))
	return d, s.notFound(err)
}

// DeleteDead implements postboxdriver.InboxExecutor.
func (s *store) DeleteDead(ctx context.Context, consumer, messageID string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.iq.del, consumer, messageID)
	if err != nil {
		return false, s.wrap(err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// PruneInbox implements postboxdriver.InboxExecutor: one bounded batch.
func (s *store) PruneInbox(ctx context.Context, age time.Duration, limit int) (int, error) {
	var n int64
	err := s.write(ctx, func(c *sql.Conn) error {
		res, err := c.ExecContext(ctx, s.iq.pruneInbox, age.Milliseconds(), limit)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		_, err = c.ExecContext(ctx, s.iq.pruneAttempts, age.Milliseconds(), limit)
		return err
	})
	return int(n), err
}

// PruneConsumerDead implements postboxdriver.InboxExecutor.
func (s *store) PruneConsumerDead(ctx context.Context, age time.Duration, limit int) (int, error) {
	res, err := s.db.ExecContext(ctx, s.iq.pruneDead, age.Milliseconds(), limit)
	if err != nil {
		return 0, s.wrap(err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

var _ postboxdriver.Raw[*sql.Tx] = (*store)(nil)

type rows struct{ *sql.Rows }

func (r rows) Close() { _ = r.Rows.Close() }

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ExecTx implements postboxdriver.Raw.
func (s *store) ExecTx(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	return affected(tx.ExecContext(ctx, query, args...))
}

// QueryTx implements postboxdriver.Raw.
func (s *store) QueryTx(ctx context.Context, tx *sql.Tx, query string, args ...any) (postboxdriver.Rows, error) {
	r, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

// Exec implements postboxdriver.Raw.
func (s *store) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return affected(s.db.ExecContext(ctx, query, args...))
}

// Query implements postboxdriver.Raw.
func (s *store) Query(ctx context.Context, query string, args ...any) (postboxdriver.Rows, error) {
	r, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

// DurabilityWarnings implements postboxdriver.DurabilityChecker. The
// setting belongs to each connection; the one the pool hands out here
// stands for the DSN they all share.
func (s *store) DurabilityWarnings(ctx context.Context) ([]string, error) {
	var level int
	if err := s.db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&level); err != nil {
		return nil, s.wrap(err)
	}
	if level < 2 {
		return []string{fmt.Sprintf("SQLite runs with synchronous=%d (below FULL): a power loss can undo transactions that committed, after the relay published their messages; open it with postboxsqlite.Open or DSN", level)}, nil
	}
	return nil, nil
}
