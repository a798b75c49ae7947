package postbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxtest"
)

// A transaction that took its seq early and commits late must still be
// published before the later rows of its key, however far the relay has
// read past its seq in the meantime (G4). Rows of other keys keep the
// relay busy beyond that seq while the transaction is open.
func TestLateCommitKeepsKeyOrder(t *testing.T) {
	driver, prefix := newDriver(t)
	pool := driver.Pool()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker := postboxtest.NewBroker(nil)
	client, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Publisher: broker, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	for round := range 5 {
		key := fmt.Sprintf("late-%d", round)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first := postbox.Message{Topic: "orders.paid", Key: key, Payload: []byte("1")}
		if err := client.WriteTx(ctx, tx, first); err != nil {
			t.Fatal(err)
		}
		// Other keys, committed and published past the open row's seq.
		for i := range 20 {
			if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: fmt.Sprintf("other-%d-%d", round, i)}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, ctx, func() bool { return countKeyPrefix(broker, fmt.Sprintf("other-%d-", round)) == 20 })
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: key, Payload: []byte("2")}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, func() bool { return len(payloadsOf(broker, key)) >= 2 })
		if got := payloadsOf(broker, key); got[0] != "1" {
			t.Fatalf("round %d: key %s published in the order %v; the late commit must come first", round, key, got)
		}
	}
}

func payloadsOf(b *postboxtest.Broker, key string) []string {
	var out []string
	for _, m := range b.Messages() {
		if m.Key == key {
			out = append(out, string(m.Payload))
		}
	}
	return out
}

func countKeyPrefix(b *postboxtest.Broker, prefix string) int {
	n := 0
	for _, m := range b.Messages() {
		if len(m.Key) >= len(prefix) && m.Key[:len(prefix)] == prefix {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, ctx context.Context, ok func() bool) {
	t.Helper()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatal("timed out waiting")
		case <-time.After(5 * time.Millisecond):
		}
	}
}
