// Package sqlkit is what the database/sql drivers (postboxsqlite,
// postboxmysql) share: the query helpers, lists bound as one JSON array,
// and the scans of postbox's rows as both store them, with times as
// BIGINT unix milliseconds of the database clock. The statements
// themselves are each dialect's own. ConnLost serves postboxsql too.
package sqlkit

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Conn is what *sql.DB, *sql.Tx and *sql.Conn share.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ConnLost reports whether tx's connection is gone, for
// postboxdriver.ConnChecker. database/sql drivers refuse a statement on a
// connection they found broken or closed by the server with
// driver.ErrBadConn. A connection the server closed while idle is found
// broken only by the next statement, which fails with an error of the
// driver's own; so a statement that fails otherwise is followed by a
// second one. (An error the server answered, as PostgreSQL does in a
// failed transaction, fails both.)
func ConnLost(ctx context.Context, tx *sql.Tx) bool {
	for range 2 {
		_, err := tx.ExecContext(ctx, "SELECT 1")
		switch {
		case err == nil || ctx.Err() != nil || errors.Is(err, sql.ErrTxDone):
			return false
		case errors.Is(err, driver.ErrBadConn):
			return true
		}
	}
	return false
}

// Scanner is a *sql.Row or a *sql.Rows.
type Scanner interface{ Scan(dest ...any) error }

// QueryAll runs a query on c and scans every row with scan.
func QueryAll[T any](ctx context.Context, c Conn, query string, args []any, scan func(r *sql.Rows) (T, error)) ([]T, error) {
	rows, err := c.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	var out []T
	err = ScanAll(rows, func(r *sql.Rows) error {
		v, err := scan(r)
		out = append(out, v)
		return err
	})
	return out, err
}

// ScanAll calls fn for every row and closes rows.
func ScanAll(rows *sql.Rows, fn func(*sql.Rows) error) error {
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// Affected is the rows an Exec reports.
func Affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// ScanString scans a row of one string.
func ScanString(r *sql.Rows) (string, error) {
	var s string
	err := r.Scan(&s)
	return s, err
}

// Ints is xs as a JSON array.
func Ints(xs []int) string {
	b := make([]byte, 0, 2+4*len(xs))
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return string(append(b, ']'))
}

// Int64s is xs as a JSON array.
func Int64s(xs []int64) string {
	b := make([]byte, 0, 2+8*len(xs))
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, x, 10)
	}
	return string(append(b, ']'))
}

// Strings is xs as a JSON array.
func Strings(xs []string) string {
	if len(xs) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(xs) // strings always marshal
	return string(b)
}

// MillisOrNil is t in unix milliseconds, or NULL for the zero time (an
// open end of a window).
func MillisOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

// LimitOr100 is a listing's limit: 100 unless one is given.
func LimitOr100(n int) int {
	if n <= 0 {
		return 100
	}
	return n
}

// DeadArgs binds a DeadFilter of the outbox's dead messages: the ids as a
// JSON array (empty for any), topic, key, and the dead_at window.
func DeadArgs(f postboxdriver.DeadFilter) []any {
	return []any{Strings(f.IDs), f.Topic, f.Key, MillisOrNil(f.Since), MillisOrNil(f.Until)}
}

// ConsumerDeadFilterArgs binds a DeadFilter of consumers' dead messages:
// the consumer, then as DeadArgs.
func ConsumerDeadFilterArgs(f postboxdriver.DeadFilter) []any {
	return append([]any{f.Consumer}, DeadArgs(f)...)
}

// BuryArgs binds a consumer's dead message for its insert: consumer,
// message id, topic, key (NULL for none), payload (never NULL), headers
// ("{}" for none), error, attempts, and the first and last failure.
func BuryArgs(d postboxdriver.DeadMessage) []any {
	var key any
	if d.Key != "" {
		key = d.Key
	}
	payload, headers := d.Stored()
	return []any{d.Consumer, d.ID, d.Topic, key, payload, headers, d.Error, d.Attempts, d.FirstFailureAt.UnixMilli(), d.LastFailureAt.UnixMilli()}
}

// ScanDeadMessage scans seq, id, topic, key, payload, headers, attempts,
// error, created_at and dead_at.
func ScanDeadMessage(r Scanner) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	var headers string
	var created, dead int64
	err := r.Scan(&d.Seq, &d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Attempts, &d.Error, &created, &dead)
	d.Payload = notNil(d.Payload)
	d.Headers = []byte(headers)
	d.CreatedAt, d.DeadAt = time.UnixMilli(created), time.UnixMilli(dead)
	return d, err
}

// ScanConsumerDead scans consumer, message id, topic, key, payload,
// headers, error, attempts, and the first failure, last failure and
// dead_at.
func ScanConsumerDead(r Scanner) (postboxdriver.DeadMessage, error) {
	var d postboxdriver.DeadMessage
	var headers string
	var first, last, dead int64
	err := r.Scan(&d.Consumer, &d.ID, &d.Topic, &d.Key, &d.Payload, &headers, &d.Error, &d.Attempts, &first, &last, &dead)
	d.Payload = notNil(d.Payload)
	d.Headers = []byte(headers)
	d.FirstFailureAt, d.LastFailureAt, d.DeadAt = time.UnixMilli(first), time.UnixMilli(last), time.UnixMilli(dead)
	return d, err
}

// ScanRecord scans a pending row as the relay reads it: seq, id, topic,
// key, payload, headers, partition, attempts and created_at.
func ScanRecord(r *sql.Rows) (postboxdriver.Record, error) {
	var rec postboxdriver.Record
	var headers string
	var created int64
	err := r.Scan(&rec.Seq, &rec.ID, &rec.Topic, &rec.Key, &rec.Payload, &headers, &rec.Partition, &rec.Attempts, &created)
	rec.Payload = notNil(rec.Payload)
	rec.Headers = []byte(headers)
	rec.CreatedAt = time.UnixMilli(created)
	return rec, err
}

// ScanLease scans partition, owner, generation, expires_at, expired, the
// database clock and crashed, setting *now to the clock.
func ScanLease(now *time.Time) func(r *sql.Rows) (postboxdriver.Lease, error) {
	return func(r *sql.Rows) (postboxdriver.Lease, error) {
		var l postboxdriver.Lease
		var exp, at int64
		err := r.Scan(&l.Partition, &l.Owner, &l.Generation, &exp, &l.Expired, &at, &l.Crashed)
		l.ExpiresAt, *now = time.UnixMilli(exp), time.UnixMilli(at)
		return l, err
	}
}

// ScanOwnedLease scans partition, owner, generation and expires_at.
func ScanOwnedLease(r *sql.Rows) (postboxdriver.Lease, error) {
	var l postboxdriver.Lease
	var exp int64
	err := r.Scan(&l.Partition, &l.Owner, &l.Generation, &exp)
	l.ExpiresAt = time.UnixMilli(exp)
	return l, err
}

// ScanSuspect scans seq and crashes.
func ScanSuspect(r *sql.Rows) (postboxdriver.Suspect, error) {
	var sp postboxdriver.Suspect
	err := r.Scan(&sp.Seq, &sp.Crashes)
	return sp, err
}

// ScanTopicStats scans topic, pending, dead, the oldest pending age and
// the last minute's publishes and longest lag, ages in milliseconds.
func ScanTopicStats(r *sql.Rows) (postboxdriver.TopicStats, error) {
	var t postboxdriver.TopicStats
	var age, lag int64
	err := r.Scan(&t.Topic, &t.Pending, &t.Dead, &age, &t.PublishedLastMinute, &lag)
	t.OldestPendingAge = time.Duration(age) * time.Millisecond
	t.PublishLagLastMinute = time.Duration(lag) * time.Millisecond
	return t, err
}

// ScanConsumerDeadStat scans consumer, topic, count and requeues asked.
func ScanConsumerDeadStat(r *sql.Rows) (postboxdriver.ConsumerDeadStat, error) {
	var c postboxdriver.ConsumerDeadStat
	err := r.Scan(&c.Consumer, &c.Topic, &c.Count, &c.RequeueRequested)
	return c, err
}

// ScanReplayAudit scans a replay audit entry.
func ScanReplayAudit(r *sql.Rows) (postboxdriver.ReplayAudit, error) {
	var a postboxdriver.ReplayAudit
	var at, since, until int64
	err := r.Scan(&a.ID, &at, &a.Actor, &since, &until, &a.Topic, &a.Key, &a.Count, &a.DryRun, &a.AsNew)
	a.At, a.Since, a.Until = time.UnixMilli(at), time.UnixMilli(since), time.UnixMilli(until)
	return a, err
}

// ScanReplayCount scans topic, count and recent.
func ScanReplayCount(r *sql.Rows) (postboxdriver.ReplayCount, error) {
	var n postboxdriver.ReplayCount
	err := r.Scan(&n.Topic, &n.Count, &n.Recent)
	return n, err
}

// ScanStats scans pending, dead, the oldest pending age in milliseconds
// and the published rows kept.
func ScanStats(r Scanner) (postboxdriver.Stats, error) {
	var st postboxdriver.Stats
	var ageMS int64
	err := r.Scan(&st.Pending, &st.Dead, &ageMS, &st.Published)
	st.OldestPendingAge = time.Duration(ageMS) * time.Millisecond
	return st, err
}

// ScanAttempts scans attempts and the first and last failure.
func ScanAttempts(r Scanner, extra ...any) (postboxdriver.Attempts, error) {
	var a postboxdriver.Attempts
	var first, last int64
	err := r.Scan(append([]any{&a.Attempts, &first, &last}, extra...)...)
	a.FirstFailureAt, a.LastFailureAt = time.UnixMilli(first), time.UnixMilli(last)
	return a, err
}

// NotFound maps a query's no-row error to postboxdriver.ErrNotFound.
func NotFound(err error) error {
	if err == sql.ErrNoRows { //nolint:errorlint // QueryRow returns it unwrapped
		return postboxdriver.ErrNotFound
	}
	return err
}

// The fetch a FetchParams asks for, of the four each dialect writes.
const (
	FetchPlain = iota
	FetchStrict
	FetchRouted
	FetchRoutedStrict
)

// Fetch says which of the four fetches p asks for and binds its
// arguments: the partitions as a JSON array, the limit, and for a routed
// fetch the topic patterns turned by patterns. It reports false when p
// reads nothing.
func Fetch(p postboxdriver.FetchParams, patterns func([]string) []string) (kind int, args []any, ok bool) {
	if len(p.Fence.Generations) == 0 || p.Limit <= 0 || (p.Topics != nil && len(p.Topics) == 0) {
		return 0, nil, false
	}
	parts := make([]int, 0, len(p.Fence.Generations))
	for part := range p.Fence.Generations {
		parts = append(parts, part)
	}
	args = []any{Ints(parts), p.Limit}
	if p.BlockOnDead {
		kind = FetchStrict
	}
	if p.Topics != nil {
		kind += FetchRouted
		args = append(args, Strings(patterns(p.Topics)))
	}
	return kind, args, true
}

// Savepoint runs a savepoint statement (verb, then the name) in tx,
// refusing on a Store's own Executor (no tx) and a name that is not a
// lower-case SQL identifier.
func Savepoint(ctx context.Context, tx *sql.Tx, verb, name string) error {
	if tx == nil {
		return postboxdriver.ErrNotInTx
	}
	if !postboxdriver.ValidSavepointName(name) {
		return fmt.Errorf("postbox: savepoint name %q is not a lower-case SQL identifier", name)
	}
	_, err := tx.ExecContext(ctx, verb+name)
	return err
}

// Taking is Coordinate's want less its drop: the partitions a relay
// takes or renews.
func Taking(want, drop []int) []int {
	dropped := make(map[int]bool, len(drop))
	for _, p := range drop {
		dropped[p] = true
	}
	take := make([]int, 0, len(want))
	for _, p := range want {
		if !dropped[p] {
			take = append(take, p)
		}
	}
	return take
}

// notNil is a payload as postbox hands it on: empty, never nil (drivers
// hand an empty blob back as nil).
func notNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
