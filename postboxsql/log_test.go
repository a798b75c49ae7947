package postboxsql_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxsql"
)

// A Driver made WithLog writes in the caller's *sql.Tx where the database
// says: the outbox while it says table, the log once it says log; its
// relay publishes what both hold, each key's messages in the order
// written.
func TestWithLog(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	db := testdb.SQLDB(t)
	var published testdb.Published
	d, err := postboxsql.New(db, postboxsql.WithLog(pool))
	if err != nil {
		t.Fatal(err)
	}
	client, err := postbox.NewClient(d, published.Config(prefix))
	if err != nil {
		t.Fatal(err)
	}
	write := func(key, payload string) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.created", Key: key, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	write("a", "1")
	if log, outbox := testdb.LogRows(t, pool, prefix); log != 0 || outbox != 1 {
		t.Fatalf("while the database says table: log %d, outbox %d rows; want 0 and 1", log, outbox)
	}
	if err := pglog.UseLog(ctx, pool, prefix); err != nil {
		t.Fatal(err)
	}
	write("a", "2")
	write("b", "1")
	write("b", "2")
	if log, outbox := testdb.LogRows(t, pool, prefix); log != 3 || outbox != 1 {
		t.Fatalf("once the database says log: log %d, outbox %d rows; want 3 and 1", log, outbox)
	}

	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	published.AwaitInKeyOrder(t, []string{"a", "b"}, 2)
}

// A relay whose pool reaches another database than its *sql.DB would
// never read what the writers log: it refuses to start, naming both.
func TestWithLogRefusesAPoolOnAnotherDatabase(t *testing.T) {
	ctx := context.Background()
	_, prefix := testdb.Migrated(t)
	u, err := url.Parse(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres"
	start := func(pool string) error {
		d, err := postboxsql.New(testdb.SQLDB(t), postboxsql.WithLog(testdb.PoolAt(t, pool)))
		if err != nil {
			t.Fatal(err)
		}
		c, err := postbox.NewClient(d, new(testdb.Published).Config(prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		return c.Stop(ctx)
	}
	if err := start(u.String()); !errors.Is(err, postboxdriver.ErrOtherDatabase) {
		t.Fatalf("start with a pool on database postgres: %v; want ErrOtherDatabase", err)
	}
	if err := start(testdb.PostgresURL()); err != nil {
		t.Fatalf("start with a pool on the same database: %v", err)
	}
}

func TestWithLogNeedsAPool(t *testing.T) {
	if _, err := postboxsql.New(testdb.SQLDB(t), postboxsql.WithLog(nil)); !errors.Is(err, postboxsql.ErrNoLogPool) {
		t.Fatalf("WithLog(nil): %v; want ErrNoLogPool", err)
	}
}

// A relay over the log listens on the pgx pool, since the *sql.DB's
// connections cannot wait for a notification: it hears a write through a
// Client on another *sql.DB (another process, as far as the database can
// tell).
func TestWithLogListensOnThePool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, prefix := testdb.Migrated(t)
	if err := pglog.UseLog(ctx, pool, prefix); err != nil {
		t.Fatal(err)
	}
	open := func() *postboxsql.Driver {
		d, err := postboxsql.New(testdb.SQLDB(t), postboxsql.WithLog(testdb.PoolAt(t, testdb.PostgresURL())))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	st, err := open().Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	l, ok := st.(postboxdriver.Listener)
	if !ok {
		t.Fatalf("the Store over the log, a %T, does not listen", st)
	}
	writer, err := postbox.NewClient(open(), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	testdb.HearsWrite(t, ctx, l, func() {
		if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("1")}); err != nil {
			t.Fatal(err)
		}
	})
}
