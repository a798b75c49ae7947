package postboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// A relay that loses its leases between the broker's ack and its mark
// changes nothing with the mark; the rows are sent again under the same
// ids, and the inbox runs the handler once per message.
func TestExpireLeasesMidBatch(t *testing.T) {
	// SQLite's ExpireLeases is in the storage conformance suite
	// (Executor/ExpireLeasesFencesOwner); here, the default prefix.
	t.Run("default prefix", func(t *testing.T) {
		driver, done := openExampleDB()
		defer done()
		expireMidBatch(t, driver, "", func(ctx context.Context, in *postbox.Inbox[pgx.Tx], d *postbox.Delivery, run func()) {
			in.Handle(ctx, "ledger", d, func(context.Context, pgx.Tx, *postbox.Delivery) error { run(); return nil })
		})
	})
	t.Run("postgres", func(t *testing.T) {
		pool, prefix := testdb.Migrated(t)
		expireMidBatch(t, postboxpgx.New(pool), prefix, func(ctx context.Context, in *postbox.Inbox[pgx.Tx], d *postbox.Delivery, run func()) {
			in.Handle(ctx, "ledger", d, func(context.Context, pgx.Tx, *postbox.Delivery) error { run(); return nil })
		})
	})
}

func expireMidBatch[TTx any](t *testing.T, driver postboxdriver.Driver[TTx], prefix string,
	handle func(context.Context, *postbox.Inbox[TTx], *postbox.Delivery, func())) {
	ctx := context.Background()
	broker := postboxtest.NewBroker(&postboxtest.BrokerOptions{DedupeWindow: -1})
	faulty := postboxtest.NewFaulty(broker)
	client, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Publisher: faulty})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "a"} {
		if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	var taken int
	faulty.AfterPublish(func(*postbox.Envelope) {
		once.Do(func() {
			taken, err = postboxtest.ExpireLeases(ctx, driver, prefix)
		})
	})
	first, derr := client.Drain(ctx)
	if !errors.Is(derr, postbox.ErrLeaseLost) {
		t.Fatalf("first drain: %v; want ErrLeaseLost", derr)
	}
	if err != nil || taken == 0 {
		t.Fatalf("ExpireLeases: %d partitions, %v", taken, err)
	}
	if first.Published != 0 {
		t.Fatalf("the first drain marked %d rows after losing its leases", first.Published)
	}
	faulty.AfterPublish(nil)
	res, err := client.Drain(ctx)
	if err != nil || res.Published != 3 {
		t.Fatalf("second drain: %+v, %v", res, err)
	}
	msgs := broker.Messages()
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.ID]++
	}
	if len(seen) != 3 || len(msgs) <= 3 {
		t.Fatalf("broker holds %d copies of %d ids; want every id, some twice", len(msgs), len(seen))
	}
	inboxClient, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	runs := 0
	for _, env := range msgs {
		handle(ctx, inbox, &postbox.Delivery{ID: env.ID, Topic: env.Topic}, func() { runs++ })
	}
	if runs != 3 {
		t.Fatalf("handler ran %d times for 3 messages delivered %d times", runs, len(msgs))
	}
}

func TestExpireLeasesBadPrefix(t *testing.T) {
	driver, done := openExampleDB()
	defer done()
	if _, err := postboxtest.ExpireLeases(context.Background(), driver, "bad;prefix"); err == nil {
		t.Fatal("a bad prefix was accepted")
	}
}

// A running relay whose leases are taken mid-batch renews at once and
// sends the fenced rows again once, not in a loop until its next renewal.
func TestExpireLeasesRunningRelay(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		driver, done := openExampleDB()
		defer done()
		expireRunning(t, driver, "")
	})
	t.Run("postgres", func(t *testing.T) {
		pool, prefix := testdb.Migrated(t)
		expireRunning(t, postboxpgx.New(pool), prefix)
	})
}

func expireRunning[TTx any](t *testing.T, driver postboxdriver.Driver[TTx], prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker := postboxtest.NewBroker(&postboxtest.BrokerOptions{DedupeWindow: -1})
	faulty := postboxtest.NewFaulty(broker)
	var once sync.Once
	var expErr error
	var taken int
	faulty.AfterPublish(func(*postbox.Envelope) {
		once.Do(func() { taken, expErr = postboxtest.ExpireLeases(ctx, driver, prefix) })
	})
	client, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Publisher: faulty, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	msgs := make([]postbox.Message, n)
	for i := range msgs {
		msgs[i] = postbox.Message{Topic: "orders.paid", Key: fmt.Sprintf("k%d", i%7)}
	}
	if err := client.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	for {
		st, err := client.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d rows still pending", st.Pending)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if expErr != nil {
		t.Fatal(expErr)
	}
	if taken == 0 {
		t.Fatal("ExpireLeases took no partition: the takeover under test did not happen")
	}
	copies := map[string]int{}
	for _, m := range broker.Messages() {
		copies[m.ID]++
	}
	if len(copies) != n {
		t.Fatalf("broker holds %d distinct ids, want %d", len(copies), n)
	}
	resent := 0
	for id, c := range copies {
		if c > 2 {
			t.Fatalf("id %s sent %d times: the relay kept publishing under its lost leases", id, c)
		}
		if c == 2 {
			resent++
		}
	}
	// The takeover landed between an ack and its mark: that batch's marks
	// were fenced out and its rows sent once more.
	if resent == 0 {
		t.Fatal("no id was sent twice: no mark was fenced out")
	}
}
