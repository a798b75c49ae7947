package postboxidem

import (
	"fmt"
	"strings"
)

// The record states. A claim is "processing" until the handler's
// transaction commits the response ("succeeded", whatever the status) or
// the claim is released for a retry ("failed").
const (
	stateProcessing = "processing"
	stateSucceeded  = "succeeded"
	stateFailed     = "failed"
)

// queries holds one dialect's statements, with the table prefix in place.
// Every time comes from the database clock, so replicas whose clocks
// disagree still agree on when a claim or a record expires.
//
// Arguments, by position:
//
//	lookup:   key_hash
//	claim:    key_hash, fingerprint, method, path, claim_token, ttl ms, claim expiry ms
//	finalize: key_hash, claim_token, status, headers JSON, body (nil for the sentinel), too_large, ttl ms
//	release:  key_hash, claim_token, status (nil when there is none)
//	cleanup:  batch size
type queries struct {
	lookup, claim, finalize, release, cleanup string
}

// lookup returns, for a key: state, fingerprint, status, headers, body,
// too_large, the milliseconds left on the claim (0 once expired), and
// whether the record itself has expired and counts as absent. A claim
// still held never counts as expired, whatever its record's TTL says, so
// that no reading of the row can run a request twice at once.
//
// claim takes the key for a new run and returns a row if it did: it
// inserts a fresh record, or takes an existing one over when that record
// has expired, or when the same body comes back after a release or after
// its claim ran out. The test and the takeover are one statement on the
// locked row, so of two retries racing for an expired claim exactly one
// gets it; the other returns no row and looks again.
//
// finalize and release are fenced by the claim token and the processing
// state: a request whose claim was taken over changes nothing, and a
// release after a commit whose outcome the caller could not see (a lost
// connection) leaves the committed record alone.
//
// cleanup deletes a bounded batch of expired records, never a claim still
// held.
var postgresQueries = queries{
	lookup: `SELECT state, fingerprint, coalesce(status, 0), coalesce(headers::text, '{}'), coalesce(body, ''::bytea), too_large,
  greatest(0, ceil(extract(epoch FROM claim_expires_at - now()) * 1000))::bigint,
  expires_at <= now() AND (state <> 'processing' OR claim_expires_at <= now())
FROM {p}idempotency WHERE key_hash = $1`,
	claim: `INSERT INTO {p}idempotency AS i (key_hash, fingerprint, method, path, state, claim_token, expires_at, claim_expires_at)
VALUES ($1, $2, $3, $4, 'processing', $5, now() + $6 * interval '1 millisecond', now() + $7 * interval '1 millisecond')
ON CONFLICT (key_hash) DO UPDATE SET
  fingerprint = EXCLUDED.fingerprint, method = EXCLUDED.method, path = EXCLUDED.path,
  state = 'processing', claim_token = EXCLUDED.claim_token,
  status = NULL, headers = NULL, body = NULL, too_large = false,
  created_at = now(), completed_at = NULL,
  expires_at = EXCLUDED.expires_at, claim_expires_at = EXCLUDED.claim_expires_at
WHERE (i.expires_at <= now() AND (i.state <> 'processing' OR i.claim_expires_at <= now()))
   OR (i.fingerprint = EXCLUDED.fingerprint
       AND (i.state = 'failed' OR (i.state = 'processing' AND i.claim_expires_at <= now())))
RETURNING 1`,
	finalize: `UPDATE {p}idempotency SET state = 'succeeded', status = $3, headers = $4::jsonb, body = $5, too_large = $6,
  completed_at = now(), expires_at = now() + $7 * interval '1 millisecond'
WHERE key_hash = $1 AND claim_token = $2 AND state = 'processing'`,
	release: `UPDATE {p}idempotency SET state = 'failed', status = $3, completed_at = now()
WHERE key_hash = $1 AND claim_token = $2 AND state = 'processing'`,
	// SKIP LOCKED: replicas cleaning up at once take different rows, and
	// a row locked by a finalize or a takeover is left for the next pass
	// (FOR UPDATE re-checks the condition on the row as changed).
	cleanup: `DELETE FROM {p}idempotency WHERE key_hash IN (
  SELECT key_hash FROM {p}idempotency
  WHERE expires_at <= now() AND (state <> 'processing' OR claim_expires_at <= now())
  ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`,
}

// sqliteQueries: times are INTEGER unix milliseconds; {now} is the
// database clock read once per statement, as postboxsqlite does. SQLite
// admits one writer at a time, so the claim's test and takeover cannot
// interleave with another writer's.
var sqliteQueries = queries{
	lookup: `SELECT state, fingerprint, coalesce(status, 0), coalesce(headers, '{}'), coalesce(body, X''), too_large,
  max(0, claim_expires_at - {now}),
  expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
FROM {p}idempotency WHERE key_hash = ?1`,
	claim: `INSERT INTO {p}idempotency (key_hash, fingerprint, method, path, state, claim_token, created_at, expires_at, claim_expires_at)
VALUES (?1, ?2, ?3, ?4, 'processing', ?5, {now}, {now} + ?6, {now} + ?7)
ON CONFLICT (key_hash) DO UPDATE SET
  fingerprint = excluded.fingerprint, method = excluded.method, path = excluded.path,
  state = 'processing', claim_token = excluded.claim_token,
  status = NULL, headers = NULL, body = NULL, too_large = 0,
  created_at = excluded.created_at, completed_at = NULL,
  expires_at = excluded.expires_at, claim_expires_at = excluded.claim_expires_at
WHERE ({p}idempotency.expires_at <= {now} AND ({p}idempotency.state <> 'processing' OR {p}idempotency.claim_expires_at <= {now}))
   OR ({p}idempotency.fingerprint = excluded.fingerprint
       AND ({p}idempotency.state = 'failed' OR ({p}idempotency.state = 'processing' AND {p}idempotency.claim_expires_at <= {now})))
RETURNING 1`,
	finalize: `UPDATE {p}idempotency SET state = 'succeeded', status = ?3, headers = ?4, body = ?5, too_large = ?6,
  completed_at = {now}, expires_at = {now} + ?7
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`,
	release: `UPDATE {p}idempotency SET state = 'failed', status = ?3, completed_at = {now}
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`,
	cleanup: `DELETE FROM {p}idempotency WHERE key_hash IN (
  SELECT key_hash FROM {p}idempotency
  WHERE expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
  ORDER BY expires_at LIMIT ?1)`,
}

// sqliteNow is postboxsqlite's database clock in unix milliseconds, in an
// uncorrelated subquery that SQLite evaluates once per statement.
const sqliteNow = `(SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER))`

// makeQueries returns the statements of dialect for the tables named with
// prefix, which New has validated as an identifier.
func makeQueries(dialect, prefix string) (queries, error) {
	var q queries
	var r *strings.Replacer
	switch dialect {
	case "postgres":
		q, r = postgresQueries, strings.NewReplacer("{p}", prefix)
	case "sqlite":
		q, r = sqliteQueries, strings.NewReplacer("{p}", prefix, "{now}", sqliteNow)
	default:
		return q, fmt.Errorf("postboxidem: no SQL for the %q dialect", dialect)
	}
	for _, s := range []*string{&q.lookup, &q.claim, &q.finalize, &q.release, &q.cleanup} {
		*s = r.Replace(*s)
	}
	return q, nil
}
