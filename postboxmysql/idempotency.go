package postboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/postbox-go/postbox/postboxdriver"
)

// idempotencyQueries are postboxidem's statements. Times are BIGINT unix
// milliseconds; {now} is the database clock, one instant per statement.
type idempotencyQueries struct {
	lookup, claim, claimed, finalize, release, prune stmt
}

func makeIdempotencyQueries(prefix string) idempotencyQueries {
	r := strings.NewReplacer("{p}", prefix, "{now}", nowExpr)
	q := func(s string) stmt { return prep(r.Replace(s)) }
	return idempotencyQueries{
		lookup: q(`SELECT state, fingerprint, COALESCE(status, 0), COALESCE(headers, '{}'), COALESCE(body, X''), too_large,
  GREATEST(0, claim_expires_at - {now}),
  expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
FROM {p}idempotency WHERE key_hash = ?1`),
		// One statement takes the row's lock at once, inserted or found:
		// of claims racing for a key, the later ones wait for the earlier
		// one's transaction and then see what it left. The first
		// assignment decides the takeover (a record expired, or released,
		// or whose claim ran out when the same body comes back) on the row
		// as it was, and leaves the new claim token only then; the others
		// follow the token, since MySQL assigns from left to right, each
		// assignment seeing those before it.
		claim: q(`INSERT INTO {p}idempotency (key_hash, fingerprint, method, path, state, claim_token, created_at, expires_at, claim_expires_at)
VALUES (?1, ?2, ?3, ?4, 'processing', ?5, {now}, {now} + ?6, {now} + ?7)
ON DUPLICATE KEY UPDATE
  claim_token = IF((expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now}))
                   OR (fingerprint = VALUES(fingerprint) AND (state = 'failed' OR (state = 'processing' AND claim_expires_at <= {now}))),
                   VALUES(claim_token), claim_token),
  fingerprint = IF(claim_token = VALUES(claim_token), VALUES(fingerprint), fingerprint),
  method = IF(claim_token = VALUES(claim_token), VALUES(method), method),
  path = IF(claim_token = VALUES(claim_token), VALUES(path), path),
  state = IF(claim_token = VALUES(claim_token), 'processing', state),
  status = IF(claim_token = VALUES(claim_token), NULL, status),
  headers = IF(claim_token = VALUES(claim_token), NULL, headers),
  body = IF(claim_token = VALUES(claim_token), NULL, body),
  too_large = IF(claim_token = VALUES(claim_token), FALSE, too_large),
  created_at = IF(claim_token = VALUES(claim_token), VALUES(created_at), created_at),
  completed_at = IF(claim_token = VALUES(claim_token), NULL, completed_at),
  expires_at = IF(claim_token = VALUES(claim_token), VALUES(expires_at), expires_at),
  claim_expires_at = IF(claim_token = VALUES(claim_token), VALUES(claim_expires_at), claim_expires_at)`),
		claimed: q(`SELECT claim_token = ?2 FROM {p}idempotency WHERE key_hash = ?1`),
		finalize: q(`UPDATE {p}idempotency SET state = 'succeeded', status = ?3, headers = ?4, body = ?5, too_large = ?6,
  completed_at = {now}, expires_at = {now} + ?7
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`),
		release: q(`UPDATE {p}idempotency SET state = 'failed', status = ?3, completed_at = {now}
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`),
		prune: q(`DELETE FROM {p}idempotency
WHERE expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
ORDER BY expires_at LIMIT ?1`),
	}
}

// LookupIdempotency implements postboxdriver.Executor.
func (s *store) LookupIdempotency(ctx context.Context, keyHash []byte) (postboxdriver.IdempotencyRecord, bool, error) {
	var rec postboxdriver.IdempotencyRecord
	err := s.idq.lookup.row(ctx, s.conn(), keyHash).
		Scan(&rec.State, &rec.Fingerprint, &rec.Status, &rec.Headers, &rec.Body, &rec.TooLarge, &rec.ClaimLeftMillis, &rec.Expired)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	return rec, err == nil, s.wrap(err)
}

// ClaimIdempotency implements postboxdriver.Executor: the claim's upsert
// and a read of the token it left, in one transaction (what the upsert
// reports as changed depends on the connection's CLIENT_FOUND_ROWS).
func (s *store) ClaimIdempotency(ctx context.Context, a postboxdriver.IdempotencyClaim) (bool, error) {
	var took bool
	err := s.write(ctx, func(c conn) error {
		if _, err := s.idq.claim.exec(ctx, c, a.KeyHash, a.Fingerprint, a.Method, a.Path, a.Token, a.TTLMillis, a.ClaimMillis); err != nil {
			return err
		}
		return s.idq.claimed.row(ctx, c, a.KeyHash, a.Token).Scan(&took)
	})
	return took, err
}

// FinalizeIdempotency implements postboxdriver.Executor.
func (s *store) FinalizeIdempotency(ctx context.Context, r postboxdriver.IdempotencyResponse) (bool, error) {
	n, err := s.idq.finalize.exec(ctx, s.conn(), r.KeyHash, r.Token, r.Status, r.Headers, r.Body, r.TooLarge, r.TTLMillis)
	return n == 1, s.wrap(err)
}

// ReleaseIdempotency implements postboxdriver.Executor.
func (s *store) ReleaseIdempotency(ctx context.Context, keyHash []byte, token string, status *int) error {
	_, err := s.idq.release.exec(ctx, s.conn(), keyHash, token, status)
	return s.wrap(err)
}

// PruneIdempotency implements postboxdriver.Executor.
func (s *store) PruneIdempotency(ctx context.Context, limit int) (int, error) {
	n, err := s.idq.prune.exec(ctx, s.conn(), limit)
	return int(n), s.wrap(err)
}
