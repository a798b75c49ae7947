package postboxidem

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxsql"
)

// TestClaimStateMachine drives each dialect's statements directly through
// the transitions the middleware relies on, including those that requests
// rarely reach, such as a claim statement meeting a live claim on SQLite,
// where the lookup before it answers most duplicates.
func TestClaimStateMachine(t *testing.T) {
	const pgAge = `UPDATE {p}idempotency SET claim_expires_at = now() - interval '1 second', expires_at = expires_at - $1 * interval '1 millisecond'`
	t.Run("pgx", func(t *testing.T) {
		pool := testdb.Pool(t)
		prefix := testdb.Prefix(t)
		testdb.DropPrefix(t, pool, prefix)
		testClaimStateMachine[pgx.Tx](t, postboxpgx.New(pool), prefix, func(ctx context.Context, d time.Duration) error {
			_, err := pool.Exec(ctx, strings.ReplaceAll(pgAge, "{p}", prefix), d.Milliseconds())
			return err
		})
	})
	t.Run("sql", func(t *testing.T) {
		pool := testdb.Pool(t)
		prefix := testdb.Prefix(t)
		testdb.DropPrefix(t, pool, prefix)
		db := testdb.SQLDB(t)
		d, err := postboxsql.New(db)
		if err != nil {
			t.Fatal(err)
		}
		testClaimStateMachine[*sql.Tx](t, d, prefix, func(ctx context.Context, d time.Duration) error {
			_, err := db.ExecContext(ctx, strings.ReplaceAll(pgAge, "{p}", prefix), d.Milliseconds())
			return err
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		d := sqlitetest.Driver(t)
		testClaimStateMachine[*sql.Tx](t, d, "pb_", func(ctx context.Context, age time.Duration) error {
			_, err := d.DB().ExecContext(ctx, `UPDATE pb_idempotency SET claim_expires_at = (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)) - 1000, expires_at = expires_at - ?1`, age.Milliseconds())
			return err
		})
	})
}

// age moves the claim past its expiry and the record back by the given
// time, standing for time passing on the database clock.
func testClaimStateMachine[TTx any](t *testing.T, d postboxdriver.Driver[TTx], prefix string, age func(context.Context, time.Duration) error) {
	ctx := context.Background()
	mig, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mig.Up(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := New(d, &Config{Prefix: prefix, TTL: time.Hour, ClaimExpiry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a := claimArgs{keyHash: keyHash("POST", "/x", "", "", "k"), fingerprint: fingerprint([]byte("body")), method: "POST", path: "/x"}
	other := a
	other.fingerprint = fingerprint([]byte("other body"))

	claim := func(c claimArgs) (claimArgs, bool) {
		t.Helper()
		c.token = uuid.NewString()
		took, err := m.claim(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return c, took
	}
	state := func() record {
		t.Helper()
		rec, found, err := m.lookup(ctx, a.keyHash)
		if err != nil || !found {
			t.Fatalf("lookup: %v, found %t", err, found)
		}
		return rec
	}
	ageBy := func(d time.Duration) {
		t.Helper()
		if err := age(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	finalize := func(c claimArgs) bool {
		t.Helper()
		var ok bool
		err := m.store.InTx(ctx, func(tx TTx) error {
			var err error
			ok, err = m.finalize(ctx, tx, c, 201, `{"X-A":["1"]}`, []byte("done"), false)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	first, ok := claim(a)
	if !ok {
		t.Fatal("the first claim was not taken")
	}
	if rec := state(); rec.state != stateProcessing || rec.claimLeftMS < 50_000 || rec.claimLeftMS > 60_000 || rec.expired {
		t.Fatalf("after the claim: %+v", rec)
	}
	if _, ok := claim(a); ok {
		t.Fatal("a live claim was taken over")
	}
	if _, ok := claim(other); ok {
		t.Fatal("a live claim was taken over with another body")
	}

	ageBy(0) // the claim expires
	if rec := state(); rec.claimLeftMS != 0 || rec.expired {
		t.Fatalf("after the claim expired: %+v", rec)
	}
	if _, ok := claim(other); ok {
		t.Fatal("an expired claim was taken over with another body")
	}
	second, ok := claim(a)
	if !ok {
		t.Fatal("an expired claim was not taken over")
	}
	if _, ok := claim(a); ok {
		t.Fatal("the fresh claim of the takeover was taken over")
	}

	// The first claimant is stale: its release and its finalize change
	// nothing.
	if err := m.release(ctx, first, ptr(500)); err != nil {
		t.Fatal(err)
	}
	if finalize(first) {
		t.Fatal("a stale claimant recorded its response")
	}
	if rec := state(); rec.state != stateProcessing {
		t.Fatalf("a stale claimant changed the record: %+v", rec)
	}

	if err := m.release(ctx, second, ptr(503)); err != nil {
		t.Fatal(err)
	}
	if rec := state(); rec.state != postboxdriver.IdempotencyFailed || rec.status != 503 {
		t.Fatalf("after the release: %+v", rec)
	}
	if _, ok := claim(other); ok {
		t.Fatal("a released key was taken with another body")
	}
	third, ok := claim(a)
	if !ok {
		t.Fatal("a released key was not taken again")
	}
	if !finalize(third) {
		t.Fatal("the claimant could not record its response")
	}
	rec := state()
	if rec.state != stateSucceeded || rec.status != 201 || string(rec.body) != "done" || rec.headers != `{"X-A": ["1"]}` && rec.headers != `{"X-A":["1"]}` {
		t.Fatalf("after the finalize: %+v", rec)
	}
	if err := m.release(ctx, third, ptr(500)); err != nil {
		t.Fatal(err)
	}
	if _, ok := claim(a); ok || state().state != stateSucceeded {
		t.Fatal("a completed record was released or taken over")
	}

	ageBy(2 * time.Hour) // past the TTL
	if rec := state(); !rec.expired {
		t.Fatalf("past the TTL: %+v", rec)
	}
	if _, ok := claim(other); !ok {
		t.Fatal("an expired record was not replaced, whatever the body")
	}
	if n, err := m.Cleanup(ctx); err != nil || n != 0 {
		t.Fatalf("Cleanup of a live claim: %d, %v", n, err)
	}
	ageBy(2 * time.Hour)
	if n, err := m.Cleanup(ctx); err != nil || n != 1 {
		t.Fatalf("Cleanup of an expired claim past its TTL: %d, %v", n, err)
	}
}

func ptr(n int) *int { return &n }
