package testdb

import (
	"context"
	"fmt"
	"strings"
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

// OverTheLog adapts h, the Harness of a driver whose Stores work over the
// log (postboxpgx.WithLog, postboxsql.WithLog), to the log: each test's
// database is switched to the log once migrated, as `postbox storage log`
// does, so that its writers write the log; and since the log holds what
// the outbox holds pending, the writes of another language's writer
// among it (migration 14), what the suite does to the outbox's rows with
// SQL it does to the log's too (an UPDATE of the outbox updates the log
// alike, and Backdate moves the log's times with the outbox's and the
// published table's: created_at, and the passes that note what was
// published and when).
func OverTheLog[T any](h postboxdrivertest.Harness[T]) postboxdrivertest.Harness[T] {
	exec, backdate := h.Exec, h.Backdate
	h.Migrated = func(t *testing.T, d postboxdriver.Driver[T], prefix string) {
		if err := exec(t, d, "UPDATE "+prefix+"storage SET storage = 'log'"); err != nil {
			t.Fatal(err)
		}
	}
	h.Exec = func(t *testing.T, d postboxdriver.Driver[T], query string, args ...any) error {
		if err := exec(t, d, query, args...); err != nil {
			return err
		}
		if pre, set, ok := strings.Cut(query, "outbox SET "); ok && strings.HasPrefix(pre, "UPDATE ") {
			return exec(t, d, pre+"log SET "+set, args...)
		}
		return nil
	}
	h.Backdate = func(t *testing.T, d postboxdriver.Driver[T], prefix, table, column string, age time.Duration) {
		backdate(t, d, prefix, table, column, age)
		if also, ok := logTimes[table+"."+column]; ok {
			backdate(t, d, prefix, also[0], also[1], age)
		}
	}
	return h
}

// logTimes are the log's columns that stand for a time column of the
// outbox's tables: the log holds what the outbox holds pending, and
// log_passes notes what it published and when.
var logTimes = map[string][2]string{
	"outbox.created_at":      {"log", "created_at"},
	"published.published_at": {"log_passes", "at"},
}
