package pgsql

import (
	"context"
	"strings"

	"github.com/postbox-go/postbox/postboxdriver"
)

// idempotencyQueries are postboxidem's statements. Every time comes from
// the database clock, so replicas whose clocks disagree still agree on
// when a claim or a record expires.
type idempotencyQueries struct {
	lookup, claim, finalize, release, prune string
}

func makeIdempotencyQueries(prefix string) idempotencyQueries {
	r := strings.NewReplacer("{p}", prefix)
	return idempotencyQueries{
		// A claim still held never counts as expired, whatever its record's
		// TTL says, so that no reading of the row can run a request twice
		// at once.
		lookup: r.Replace(`SELECT state, fingerprint, coalesce(status, 0), coalesce(headers::text, '{}'), coalesce(body, ''::bytea), too_large,
  greatest(0, ceil(extract(epoch FROM claim_expires_at - now()) * 1000))::bigint,
  expires_at <= now() AND (state <> 'processing' OR claim_expires_at <= now())
FROM {p}idempotency WHERE key_hash = $1`),
		// The test and the takeover are one statement on the locked row,
		// so of two retries racing for an expired claim exactly one gets
		// it; the other returns no row and looks again.
		claim: r.Replace(`INSERT INTO {p}idempotency AS i (key_hash, fingerprint, method, path, state, claim_token, expires_at, claim_expires_at)
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
RETURNING 1`),
		// Fenced by the claim token and the processing state: a request
		// whose claim was taken over changes nothing, and a release after
		// a commit whose outcome the caller could not see (a lost
		// connection) leaves the committed record alone.
		finalize: r.Replace(`UPDATE {p}idempotency SET state = 'succeeded', status = $3, headers = $4::jsonb, body = $5, too_large = $6,
  completed_at = now(), expires_at = now() + $7 * interval '1 millisecond'
WHERE key_hash = $1 AND claim_token = $2 AND state = 'processing'`),
		release: r.Replace(`UPDATE {p}idempotency SET state = 'failed', status = $3, completed_at = now()
WHERE key_hash = $1 AND claim_token = $2 AND state = 'processing'`),
		// SKIP LOCKED: replicas cleaning up at once take different rows, and
		// a row locked by a finalize or a takeover is left for the next pass
		// (FOR UPDATE re-checks the condition on the row as changed).
		prune: r.Replace(`DELETE FROM {p}idempotency WHERE key_hash IN (
  SELECT key_hash FROM {p}idempotency
  WHERE expires_at <= now() AND (state <> 'processing' OR claim_expires_at <= now())
  ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)`),
	}
}

// LookupIdempotency implements postboxdriver.Executor.
func (c *Core) LookupIdempotency(ctx context.Context, keyHash []byte) (postboxdriver.IdempotencyRecord, bool, error) {
	rec, err := queryOne(ctx, c, c.idq.lookup, []any{keyHash}, func(r Rows) (postboxdriver.IdempotencyRecord, error) {
		var rec postboxdriver.IdempotencyRecord
		err := r.Scan(&rec.State, &rec.Fingerprint, &rec.Status, &rec.Headers, &rec.Body, &rec.TooLarge, &rec.ClaimLeftMillis, &rec.Expired)
		return rec, err
	})
	if err == postboxdriver.ErrNotFound { //nolint:errorlint // queryOne returns it unwrapped
		return rec, false, nil
	}
	return rec, err == nil, err
}

// ClaimIdempotency implements postboxdriver.Executor.
func (c *Core) ClaimIdempotency(ctx context.Context, a postboxdriver.IdempotencyClaim) (bool, error) {
	took, err := queryAll(ctx, c, c.idq.claim, []any{a.KeyHash, a.Fingerprint, a.Method, a.Path, a.Token, a.TTLMillis, a.ClaimMillis}, func(r Rows) (int, error) {
		var one int
		return one, r.Scan(&one)
	})
	return len(took) > 0, err
}

// FinalizeIdempotency implements postboxdriver.Executor.
func (c *Core) FinalizeIdempotency(ctx context.Context, r postboxdriver.IdempotencyResponse) (bool, error) {
	n, err := c.exec(ctx, c.idq.finalize, r.KeyHash, r.Token, r.Status, r.Headers, r.Body, r.TooLarge, r.TTLMillis)
	return n == 1, err
}

// ReleaseIdempotency implements postboxdriver.Executor.
func (c *Core) ReleaseIdempotency(ctx context.Context, keyHash []byte, token string, status *int) error {
	_, err := c.exec(ctx, c.idq.release, keyHash, token, status)
	return err
}

// PruneIdempotency implements postboxdriver.Executor.
func (c *Core) PruneIdempotency(ctx context.Context, limit int) (int, error) {
	n, err := c.exec(ctx, c.idq.prune, limit)
	return int(n), err
}
