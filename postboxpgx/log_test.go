package postboxpgx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A Driver made WithLog writes where the database says, in a pgx.Tx and
// in a Tx (with its COMMIT) alike, and its relay publishes what both
// tables hold, each key's messages in the order written; a Driver without
// it is refused a relay once the database says log.
func TestWithLog(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	var published testdb.Published
	cfg := published.Config(prefix)
	client, err := postbox.NewClient(postboxpgx.New(pool, postboxpgx.WithLog()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rows := func() (log, outbox int) { return testdb.LogRows(t, pool, prefix) }
	// write writes key/payload in a pgx.Tx, or in a Tx when pipelined,
	// and checks that a Tx sends its insert with the COMMIT: its own
	// statements see no new row before.
	write := func(pipelined bool, key, payload string) {
		t.Helper()
		var tx pgx.Tx
		if pipelined {
			tx, err = postboxpgx.Begin(ctx, pool)
		} else {
			tx, err = pool.Begin(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		inTx := func() (n int) {
			t.Helper()
			if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+prefix+`log) + (SELECT count(*) FROM `+prefix+`outbox)`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := inTx()
		if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "t", Key: key, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
		if after := inTx(); pipelined != (after == before) {
			t.Fatalf("the transaction sees %d rows before its write and %d after; a Tx sends it with the COMMIT, a pgx.Tx at once", before, after)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// While the database says table, the writer keeps the outbox.
	write(false, "a", "1")
	write(true, "b", "1")
	if l, o := rows(); l != 0 || o != 2 {
		t.Fatalf("writes while the database says table: %d rows in the log, %d in the outbox; want 0 and 2", l, o)
	}
	if err := pglog.UseLog(ctx, pool, prefix); err != nil {
		t.Fatal(err)
	}
	write(false, "a", "2")
	write(true, "b", "2")
	if l, o := rows(); l != 2 || o != 2 {
		t.Fatalf("writes once the database says log: %d rows in the log, %d in the outbox; want 2 and 2", l, o)
	}

	plain, err := postbox.NewClient(postboxpgx.New(pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Start(ctx); !errors.Is(err, postboxdriver.ErrStorageRefused) {
		t.Fatalf("a relay without WithLog on a database that says log: %v, want ErrStorageRefused", err)
	}

	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	published.AwaitInKeyOrder(t, []string{"a", "b"}, 2)
	deadline := time.Now().Add(20 * time.Second)
	// The last batch's record may ride on the relay's next read.
	for {
		s, err := client.Admin().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending == 0 && s.Published == 4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status = %+v; want nothing pending and 4 published", s.Stats)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
