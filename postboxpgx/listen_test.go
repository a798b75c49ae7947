package postboxpgx_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// listener opens the store of prefix on pool as a postboxdriver.Listener.
func listener(t *testing.T, d *postboxpgx.Driver, prefix string) postboxdriver.Listener {
	t.Helper()
	store, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	l, ok := store.(postboxdriver.Listener)
	if !ok {
		t.Fatal("the pgx store is not a postboxdriver.Listener")
	}
	return l
}

// listening runs l.Listen until stop, which checks that it then ends with
// context.Canceled, and returns what it hears once it is ready.
func listening(t *testing.T, ctx context.Context, l postboxdriver.Listener) (heard chan postboxdriver.Heard, stop func()) {
	t.Helper()
	ready := make(chan struct{})
	heard = make(chan postboxdriver.Heard, 100)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- l.Listen(lctx, func() { close(ready) }, func(h postboxdriver.Heard) { heard <- h })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("listen ended before it was ready: %v", err)
	case <-ctx.Done():
		cancel()
		t.Fatal("the listener never became ready")
	}
	return heard, func() {
		t.Helper()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("listen returned %v after its context ended, want context.Canceled", err)
		}
	}
}

// A write through a Client on another pool (another process, as far as
// the database can tell) reaches a listener on the same tables as a
// change signal, sent after the write and outside its transaction.
func TestListenHearsWritesOfAnotherClient(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := listener(t, postboxpgx.New(pool), prefix)
	heard, stop := listening(t, ctx, l)
	writer, err := postbox.NewClient(postboxpgx.New(testdb.PoolAt(t, testdb.PostgresURL())), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	msg := postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("p")}
	want := []int{postboxdriver.PartitionOf("k", "", 64)}
	expect := func(what string, parts []int, committed bool) {
		t.Helper()
		select {
		case h := <-heard:
			if !slices.Equal(h.Partitions, parts) || h.Committed != committed {
				t.Fatalf("%s: heard %+v, want partitions %v, committed %v", what, h, parts, committed)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no change signal heard", what)
		}
	}
	// The signal names the partition written, so that the relay wakes
	// only the lane that reads it, and says the write had committed
	// (Write's own transaction), so that the lane reads once.
	if err := writer.Write(ctx, msg); err != nil {
		t.Fatal(err)
	}
	expect("Write", want, true)
	// A postboxpgx.Tx signals once Commit has committed.
	ptx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.WriteTx(ctx, ptx, msg); err != nil {
		t.Fatal(err)
	}
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expect("postboxpgx.Tx", want, true)
	// A pgx.Tx's commit is not seen: its signal goes before it, early.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.WriteTx(ctx, tx, msg); err != nil {
		t.Fatal(err)
	}
	expect("pgx.Tx", want, false)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A signal sent with SQL, as a writer in another language may, names
	// no partition: every lane wakes.
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, '')", prefix+"outbox"); err != nil {
		t.Fatal(err)
	}
	expect("pg_notify sent with SQL", nil, false)
	stop()
}

// A relay's Coordinate on another pool announces a change among the relays
// (Heard.Relays) when it registers anew, lets leases go, or leaves, and
// only then: a plain renewal announces nothing, so that a steady fleet
// sends no signals.
func TestListenHearsRelaysJoinAndLeave(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := listener(t, postboxpgx.New(pool), prefix)
	heard, stop := listening(t, ctx, l)
	other, err := postboxpgx.New(testdb.PoolAt(t, testdb.PostgresURL())).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	// A marker sent with SQL after each call: it arrives after whatever
	// the call sent, so that hearing it first proves the call sent nothing.
	marker := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, "SELECT pg_notify($1, '')", prefix+"outbox"); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, relays bool) {
		t.Helper()
		marker()
		select {
		case h := <-heard:
			if h.Relays != relays {
				t.Fatalf("%s: heard %+v first, want Relays %v", what, h, relays)
			}
		case <-ctx.Done():
			t.Fatalf("%s: nothing heard", what)
		}
		if !relays {
			return
		}
		select {
		case h := <-heard:
			if h.Relays {
				t.Fatalf("%s: announced twice", what)
			}
		case <-ctx.Done():
			t.Fatalf("%s: the marker was not heard", what)
		}
	}
	coordinate := func(ttl time.Duration, want, drop []int) {
		t.Helper()
		if _, err := other.Coordinate(ctx, "r1", ttl, want, drop, nil); err != nil {
			t.Fatal(err)
		}
	}
	coordinate(time.Minute, []int{0, 1, 2}, nil)
	expect("a relay joining", true)
	coordinate(time.Minute, []int{0, 1, 2}, nil)
	expect("a renewal", false)
	coordinate(time.Minute, []int{0, 1}, []int{2})
	expect("a relay letting a partition go", true)
	coordinate(0, nil, []int{0, 1})
	expect("a relay leaving", true)
	stop()
}

// Through a transaction pooler a LISTEN would stay on a server connection
// that goes on serving others: Listen refuses, with ErrNoSignals, and
// leaves no server connection listening.
func TestListenRefusesTransactionPooler(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	through := testdb.PoolAt(t, testdb.BouncerURL(t, "default_query_exec_mode=cache_describe"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := listener(t, postboxpgx.New(through), prefix).Listen(ctx, func() { t.Error("ready through a transaction pooler") }, func(postboxdriver.Heard) {})
	if !errors.Is(err, postboxdriver.ErrNoSignals) {
		t.Fatalf("listen through PgBouncer: %v, want ErrNoSignals", err)
	}
	t.Logf("refused: %v", err)
	var listening int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN "`+prefix+`%'`).Scan(&listening); err != nil {
		t.Fatal(err)
	}
	if listening != 0 {
		t.Fatalf("%d server connections left listening", listening)
	}
}
