package postboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

// idempotencyQueries are postboxidem's statements. Times are INTEGER unix
// milliseconds; {now} is the database clock read once per statement.
// SQLite admits one writer at a time, so the claim's test and takeover
// cannot interleave with another writer's.
type idempotencyQueries struct {
	lookup, claim, finalize, release, prune string
}

func makeIdempotencyQueries(prefix string) idempotencyQueries {
	r := strings.NewReplacer("{p}", prefix, "{now}", "(SELECT "+nowExpr+")")
	return idempotencyQueries{
		lookup: r.Replace(`SELECT state, fingerprint, coalesce(status, 0), coalesce(headers, '{}'), coalesce(body, X''), too_large,
  max(0, claim_expires_at - {now}),
  expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
FROM {p}idempotency WHERE key_hash = ?1`),
		claim: r.Replace(`INSERT INTO {p}idempotency (key_hash, fingerprint, method, path, state, claim_token, created_at, expires_at, claim_expires_at)
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
RETURNING 1`),
		finalize: r.Replace(`UPDATE {p}idempotency SET state = 'succeeded', status = ?3, headers = ?4, body = ?5, too_large = ?6,
  completed_at = {now}, expires_at = {now} + ?7
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`),
		release: r.Replace(`UPDATE {p}idempotency SET state = 'failed', status = ?3, completed_at = {now}
WHERE key_hash = ?1 AND claim_token = ?2 AND state = 'processing'`),
		prune: r.Replace(`DELETE FROM {p}idempotency WHERE key_hash IN (
  SELECT key_hash FROM {p}idempotency
  WHERE expires_at <= {now} AND (state <> 'processing' OR claim_expires_at <= {now})
  ORDER BY expires_at LIMIT ?1)`),
	}
}

// LookupIdempotency implements postboxdriver.Executor.
func (s *store) LookupIdempotency(ctx context.Context, keyHash []byte) (postboxdriver.IdempotencyRecord, bool, error) {
	var rec postboxdriver.IdempotencyRecord
	err := s.conn().QueryRowContext(ctx, s.idq.lookup, keyHash).
		Scan(&rec.State, &rec.Fingerprint, &rec.Status, &rec.Headers, &rec.Body, &rec.TooLarge, &rec.ClaimLeftMillis, &rec.Expired)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, false, nil
	}
	return rec, err == nil, s.wrap(err)
}

// ClaimIdempotency implements postboxdriver.Executor.
func (s *store) ClaimIdempotency(ctx context.Context, a postboxdriver.IdempotencyClaim) (bool, error) {
	took, err := sqlkit.QueryAll(ctx, s.conn(), s.idq.claim, []any{a.KeyHash, a.Fingerprint, a.Method, a.Path, a.Token, a.TTLMillis, a.ClaimMillis},
		func(r *sql.Rows) (int, error) {
			var one int
			return one, r.Scan(&one)
		})
	return len(took) > 0, s.wrap(err)
}

// FinalizeIdempotency implements postboxdriver.Executor.
func (s *store) FinalizeIdempotency(ctx context.Context, r postboxdriver.IdempotencyResponse) (bool, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.idq.finalize, r.KeyHash, r.Token, r.Status, r.Headers, r.Body, r.TooLarge, r.TTLMillis))
	return n == 1, s.wrap(err)
}

// ReleaseIdempotency implements postboxdriver.Executor.
func (s *store) ReleaseIdempotency(ctx context.Context, keyHash []byte, token string, status *int) error {
	_, err := s.conn().ExecContext(ctx, s.idq.release, keyHash, token, status)
	return s.wrap(err)
}

// PruneIdempotency implements postboxdriver.Executor.
func (s *store) PruneIdempotency(ctx context.Context, limit int) (int, error) {
	n, err := sqlkit.Affected(s.conn().ExecContext(ctx, s.idq.prune, limit))
	return int(n), s.wrap(err)
}
