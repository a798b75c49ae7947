package postboxidem

import (
	"context"
	"errors"
	"fmt"

	"github.com/postbox-go/postbox/postboxdriver"
)

// The record states (postboxdriver.Idempotency*).
const (
	stateProcessing = postboxdriver.IdempotencyProcessing
	stateSucceeded  = postboxdriver.IdempotencySucceeded
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
func (m *Middleware[TTx]) lookup(ctx context.Context, keyHash []byte) (record, bool, error) {
	r, found, err := m.store.LookupIdempotency(ctx, keyHash)
	if err != nil || !found {
		return record{}, false, m.wrap("look up the key", err)
	}
	return record{state: r.State, fingerprint: r.Fingerprint, status: r.Status, headers: r.Headers, body: r.Body,
		tooLarge: r.TooLarge, claimLeftMS: r.ClaimLeftMillis, expired: r.Expired}, true, nil
}

// claim takes the key for a run and reports whether it did.
func (m *Middleware[TTx]) claim(ctx context.Context, a claimArgs) (bool, error) {
	took, err := m.store.ClaimIdempotency(ctx, postboxdriver.IdempotencyClaim{
		KeyHash: a.keyHash, Fingerprint: a.fingerprint, Method: a.method, Path: a.path, Token: a.token,
		TTLMillis: m.cfg.TTL.Milliseconds(), ClaimMillis: m.cfg.ClaimExpiry.Milliseconds(),
	})
	return took, m.wrap("claim the key", err)
}

// finalize writes the response in the handler's transaction tx. It
// reports false when the claim is no longer this request's.
func (m *Middleware[TTx]) finalize(ctx context.Context, tx TTx, a claimArgs, status int, headers string, body []byte, tooLarge bool) (bool, error) {
	ok, err := m.store.UnwrapExecutor(tx).FinalizeIdempotency(ctx, postboxdriver.IdempotencyResponse{
		KeyHash: a.keyHash, Token: a.token, Status: status, Headers: headers, Body: body, TooLarge: tooLarge,
		TTLMillis: m.cfg.TTL.Milliseconds(),
	})
	return ok, m.wrap("record the response", err)
}

// release lets a retry run the request again. status is nil when the
// handler produced none (a panic, a store failure).
func (m *Middleware[TTx]) release(ctx context.Context, a claimArgs, status *int) error {
	return m.wrap("release the key", m.store.ReleaseIdempotency(ctx, a.keyHash, a.token, status))
}

// wrap names the step that failed; a missing table is already marked
// postboxdriver.ErrNotMigrated by the driver.
func (m *Middleware[TTx]) wrap(step string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, postboxdriver.ErrNotMigrated) {
		return fmt.Errorf("postboxidem: %s: table %sidempotency; run the migrations: %w", step, m.cfg.Prefix, err)
	}
	return fmt.Errorf("postboxidem: %s: %w", step, err)
}
