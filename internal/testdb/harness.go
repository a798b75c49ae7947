package testdb

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
)

// PgxHarness is the storage conformance suite's Harness for a driver over
// a pgx pool: open makes each test's driver over a pool of its own at
// databaseURL, and poolOf returns the pool of a driver open made. The
// crash tests' relays in other processes reach PostgresURL.
func PgxHarness(databaseURL string, open func(*pgxpool.Pool) postboxdriver.Driver[pgx.Tx], poolOf func(postboxdriver.Driver[pgx.Tx]) *pgxpool.Pool) postboxdrivertest.Harness[pgx.Tx] {
	return postboxdrivertest.Harness[pgx.Tx]{
		New: func(t *testing.T) (postboxdriver.Driver[pgx.Tx], string) {
			pool := PoolAt(t, databaseURL)
			prefix := Prefix(t)
			DropPrefix(t, Pool(t), prefix)
			return open(pool), prefix
		},
		Begin: func(t *testing.T, ctx context.Context, d postboxdriver.Driver[pgx.Tx]) (pgx.Tx, func() error, func() error) {
			tx, err := poolOf(d).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		},
		Backdate: func(t *testing.T, d postboxdriver.Driver[pgx.Tx], prefix, table, column string, age time.Duration) {
			sql := fmt.Sprintf("UPDATE %s%s SET %s = %s - interval '%d milliseconds'", prefix, table, column, column, age.Milliseconds())
			if _, err := poolOf(d).Exec(context.Background(), sql); err != nil {
				t.Fatal(err)
			}
		},
		Exec: func(_ *testing.T, d postboxdriver.Driver[pgx.Tx], query string, args ...any) error {
			_, err := poolOf(d).Exec(context.Background(), query, args...)
			return err
		},
		Locate: func(*testing.T, postboxdriver.Driver[pgx.Tx]) string { return PostgresURL() },
		Sever: func(t *testing.T, _ postboxdriver.Driver[pgx.Tx], tx pgx.Tx) {
			var pid int
			if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			Terminate(t, pid)
		},
		Features: postboxdrivertest.Features{ConcurrentWriters: true},
	}
}
