package postboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxpgx"
)

// TestConformancePipelined runs the storage suite with every transaction a
// postboxpgx.Tx, whose messages go with its COMMIT.
func TestConformancePipelined(t *testing.T) {
	h := harness(testdb.PostgresURL())
	h.Begin = func(t *testing.T, ctx context.Context, d postboxdriver.Driver[pgx.Tx]) (pgx.Tx, func() error, func() error) {
		tx, err := postboxpgx.Begin(ctx, d.(*postboxpgx.Driver).Pool())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
	}
	postboxdrivertest.Run(t, h)
}

// pipelined is a migrated table set, a client on it and a domain table.
func pipelined(t *testing.T) (*pgxpool.Pool, *postbox.Client[pgx.Tx], string) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	// No change signals: their sender borrows one of the pool's
	// connections for a moment after each write, and these tests count
	// the connections a Tx leaves acquired.
	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, NoSignals: true})
	if err != nil {
		t.Fatal(err)
	}
	domain := prefix + "orders"
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+domain+" (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+domain) })
	return pool, client, prefix
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestTxCommitSendsMessagesWithTheCommit(t *testing.T) {
	pool, client, prefix := pipelined(t)
	ctx := context.Background()
	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Rollback after Commit = %v, want pgx.ErrTxClosed", err)
		}
	}()
	if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"orders VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	msgs := []postbox.Message{{Topic: "orders.created", Key: "1", Payload: []byte("a")}, {Topic: "orders.created", Key: "1", Payload: []byte("b")}}
	if err := client.WriteTx(ctx, tx, msgs[0]); err != nil {
		t.Fatal(err)
	}
	if err := client.WriteTx(ctx, tx, msgs[1:]...); err != nil {
		t.Fatal(err)
	}
	// Not sent yet: the transaction's own statements do not see them.
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"outbox").Scan(&n); err != nil || n != 0 {
		t.Fatalf("outbox inside the transaction before Commit: %d rows, %v; want 0", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := count(t, pool, prefix+"orders"); got != 1 {
		t.Errorf("orders = %d, want 1", got)
	}
	rows, err := pool.Query(ctx, "SELECT payload, partition FROM "+prefix+"outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var p []byte
		var part int
		err := r.Scan(&p, &part)
		return fmt.Sprintf("%s/%d", p, part), err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("a/%d", partitionOf("1"))
	if len(got) != 2 || got[0] != want || got[1] != fmt.Sprintf("b/%d", partitionOf("1")) {
		t.Errorf("outbox = %v, want [%s b/…] in order", got, want)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Exec after Commit = %v, want pgx.ErrTxClosed", err)
	}
	if s := pool.Stat(); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired after Commit", s.AcquiredConns())
	}
}

// partitionOf is the partition of a keyed row (the suite holds Go's
// PartitionOf to the database's).
func partitionOf(key string) int { return postboxdriver.PartitionOf(key, "", 64) }

// An insert that fails at Commit takes the domain rows with it, and the
// connection goes back to the pool outside any transaction.
func TestTxCommitFailureWritesNothing(t *testing.T) {
	pool, client, prefix := pipelined(t)
	ctx := context.Background()
	id := postbox.NewID()
	if err := client.Write(ctx, postbox.Message{ID: id, Topic: "orders.created", Payload: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"orders VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	// The same id again: checked in Go only against the write's own
	// messages, refused by the table's unique id at Commit.
	if err := client.WriteTx(ctx, tx, postbox.Message{ID: id, Topic: "orders.created", Payload: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	err = tx.Commit(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("Commit = %v, want the unique violation", err)
	}
	if got := count(t, pool, prefix+"orders"); got != 0 {
		t.Errorf("orders = %d after a failed Commit, want 0", got)
	}
	if got := count(t, pool, prefix+"outbox"); got != 1 {
		t.Errorf("outbox = %d after a failed Commit, want the first message alone", got)
	}
	if s := pool.Stat(); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired after a failed Commit", s.AcquiredConns())
	}
	// The pool's connections are usable: no transaction left open on one.
	for range pool.Stat().TotalConns() {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s := c.Conn().PgConn().TxStatus(); s != 'I' {
			t.Errorf("a pooled connection is in transaction status %q", s)
		}
		defer c.Release()
	}
}

// A transaction that failed before Commit is rolled back, messages and all.
func TestTxCommitOfAFailedTransaction(t *testing.T) {
	pool, client, prefix := pipelined(t)
	ctx := context.Background()
	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.created", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+prefix+"orders VALUES (NULL)"); err == nil {
		t.Fatal("inserting a NULL primary key succeeded")
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit of a failed transaction succeeded")
	}
	if got := count(t, pool, prefix+"outbox"); got != 0 {
		t.Errorf("outbox = %d, want 0", got)
	}
	if s := pool.Stat(); s.AcquiredConns() != 0 {
		t.Errorf("%d connections still acquired", s.AcquiredConns())
	}
}

// Rollback forgets the queued messages; a savepoint's messages are
// inserted at once, so rolling the savepoint back takes them with it.
func TestTxRollbackAndSavepoints(t *testing.T) {
	pool, client, prefix := pipelined(t)
	ctx := context.Background()
	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "t.rolled", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Commit after Rollback = %v, want pgx.ErrTxClosed", err)
	}

	tx, err = postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for i, keep := range []bool{false, true} {
		sp, err := tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := client.WriteTx(ctx, sp, postbox.Message{Topic: fmt.Sprintf("t.savepoint%d", i), Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if keep {
			err = sp.Commit(ctx)
		} else {
			err = sp.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "t.top", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, "SELECT topic FROM "+prefix+"outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	topics, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(topics) != "[t.savepoint1 t.top]" {
		t.Errorf("outbox topics = %v, want [t.savepoint1 t.top]", topics)
	}
}
