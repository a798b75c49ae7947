package postboxidem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/postbox-go/postbox/postboxdriver"
)

// record is a key's row as lookup reads it.
type record struct {
	state       string
	fingerprint []byte
	status      int
	headers     string // JSON object
	body        []byte
	tooLarge    bool
	claimLeftMS int64 // 0 once the claim has expired
	expired     bool  // past its TTL: counts as absent
}

// claimArgs names a claim to take.
type claimArgs struct {
	keyHash, fingerprint []byte
	method, path, token  string
}

// lookup reads the record of keyHash; found is false when there is none.
func (m *Middleware[TTx]) lookup(ctx context.Context, keyHash []byte) (rec record, found bool, err error) {
	rows, err := m.raw.Query(ctx, m.q.lookup, keyHash)
	if err != nil {
		return rec, false, m.wrap("look up the key", err)
	}
	defer rows.Close()
	if rows.Next() {
		found = true
		err = rows.Scan(&rec.state, &rec.fingerprint, &rec.status, &rec.headers, &rec.body, &rec.tooLarge, &rec.claimLeftMS, &rec.expired)
	}
	if err == nil {
		err = rows.Err()
	}
	return rec, found, m.wrap("look up the key", err)
}

// claim takes the key for a run and reports whether it did.
func (m *Middleware[TTx]) claim(ctx context.Context, a claimArgs) (bool, error) {
	rows, err := m.raw.Query(ctx, m.q.claim, a.keyHash, a.fingerprint, a.method, a.path, a.token,
		m.cfg.TTL.Milliseconds(), m.cfg.ClaimExpiry.Milliseconds())
	if err != nil {
		return false, m.wrap("claim the key", err)
	}
	defer rows.Close()
	took := rows.Next()
	return took, m.wrap("claim the key", rows.Err())
}

// finalize writes the response in the handler's transaction tx. It
// reports false when the claim is no longer this request's.
func (m *Middleware[TTx]) finalize(ctx context.Context, tx TTx, a claimArgs, status int, headers string, body []byte, tooLarge bool) (bool, error) {
	n, err := m.raw.ExecTx(ctx, tx, m.q.finalize, a.keyHash, a.token, status, headers, body, tooLarge, m.cfg.TTL.Milliseconds())
	return n == 1, m.wrap("record the response", err)
}

// release lets a retry run the request again. status is nil when the
// handler produced none (a panic, a store failure).
func (m *Middleware[TTx]) release(ctx context.Context, a claimArgs, status any) error {
	_, err := m.raw.Exec(ctx, m.q.release, a.keyHash, a.token, status)
	return m.wrap("release the key", err)
}

// wrap names the step that failed and marks a missing table as
// postboxdriver.ErrNotMigrated, without importing either database client.
func (m *Middleware[TTx]) wrap(step string, err error) error {
	if err == nil {
		return nil
	}
	if isUndefinedTable(err) {
		return fmt.Errorf("postboxidem: %s: %w (table %sidempotency; run the migrations): %w", step, postboxdriver.ErrNotMigrated, m.cfg.Prefix, err)
	}
	return fmt.Errorf("postboxidem: %s: %w", step, err)
}

func isUndefinedTable(err error) bool {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState() == "42P01" // PostgreSQL undefined_table
	}
	return strings.Contains(err.Error(), "no such table")
}
