package postboxtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// Messages go from the outbox through Drain to the in-memory broker, and
// from its subscriber through the inbox to a handler, whose effect is
// counted once even though the broker delivers a copy.
func TestDrainToInbox(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	broker := postboxtest.NewBroker(&postboxtest.BrokerOptions{DedupeWindow: -1})
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: broker, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "o1", Payload: []byte{byte('0' + i)}}); err != nil {
			t.Fatal(err)
		}
	}

	// While the broker is down, Drain stops with the infrastructure error
	// and nothing spends an attempt.
	broker.SetDown(true)
	if _, err := client.Drain(ctx); !errors.Is(err, postboxtest.ErrBrokerDown) {
		t.Fatalf("drain while down: %v", err)
	}
	broker.SetDown(false)
	res, err := client.Drain(ctx)
	if err != nil || res.Published != 10 || res.Waiting != 0 {
		t.Fatalf("drain = %+v, %v", res, err)
	}
	for _, env := range broker.Messages() {
		if env.Attempt != 1 {
			t.Fatalf("attempt %d: the outage spent attempts", env.Attempt)
		}
	}
	// Publish the first message again, as a relay that crashed before its
	// mark would: the broker (no dedupe here) stores a copy.
	broker.Publish(ctx, broker.Messages()[0], func(error) {})

	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	applied := make(chan string, 20)
	sub := broker.Subscriber("ledger", &postboxtest.SubscriberOptions{PerKey: true})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- sub.Run(runCtx, inbox.Processor("ledger", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
			applied <- string(d.Payload)
			return nil
		}))
	}()
	var order string
	for range 10 {
		select {
		case p := <-applied:
			order += p
		case <-time.After(10 * time.Second):
			t.Fatal("handler not called")
		}
	}
	if order != "0123456789" {
		t.Fatalf("handled %q, want 0123456789", order)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(broker.Settled("ledger")) < 11 {
		if time.Now().After(deadline) {
			t.Fatal("copy not settled")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-applied:
		t.Fatalf("the copy of %s ran its handler again", p)
	default:
	}
}
