package postboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxtest"
)

// A relay that "crashes" between the broker's ack and its mark sends the
// message again; the consumer's inbox runs its handler once.
func TestFaultyCrashAfterPublish(t *testing.T) {
	driver, done := openExampleDB()
	defer done()
	ctx := context.Background()
	broker := postboxtest.NewBroker(&postboxtest.BrokerOptions{DedupeWindow: -1})
	faulty := postboxtest.NewFaulty(broker)
	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: faulty})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "o1"}); err != nil {
		t.Fatal(err)
	}
	faulty.CrashAfterPublish(1)
	if _, err := client.Drain(ctx); !errors.Is(err, postboxtest.ErrCrashedBeforeMark) {
		t.Fatalf("drain: %v", err)
	}
	if res, err := client.Drain(ctx); err != nil || res.Published != 1 {
		t.Fatalf("second drain: %+v, %v", res, err)
	}
	msgs := broker.Messages()
	if len(msgs) != 2 || msgs[0].ID != msgs[1].ID || msgs[1].Attempt != 1 {
		t.Fatalf("broker holds %d messages; want the same id twice, no attempt spent", len(msgs))
	}
	inboxClient, err := postbox.NewClient(driver, nil)
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	runs := 0
	for _, env := range msgs {
		inbox.Handle(ctx, "ledger", &postbox.Delivery{ID: env.ID, Topic: env.Topic}, func(context.Context, pgx.Tx, *postbox.Delivery) error {
			runs++
			return nil
		})
	}
	if runs != 1 {
		t.Fatalf("handler ran %d times for one message delivered twice", runs)
	}
}

func TestFaultyStallAndFail(t *testing.T) {
	driver, done := openExampleDB()
	defer done()
	ctx := context.Background()
	broker := postboxtest.NewBroker(nil)
	faulty := postboxtest.NewFaulty(broker)
	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: faulty, LeaseDuration: time.Second, BatchDeadline: 50 * time.Millisecond,
		MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Write(ctx, postbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	// A stall past the batch deadline is an outage: nothing spent.
	faulty.Stall(time.Second)
	if _, err := client.Drain(ctx); err == nil {
		t.Fatal("a stalled broker did not fail the drain")
	}
	faulty.Stall(0)
	// A rejection spends attempts and, past the budget, buries the message.
	faulty.FailNext(2, postbox.NewMessageError(fmt.Errorf("rejected")))
	for range 20 {
		res, err := client.Drain(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Dead == 1 {
			if len(broker.Messages()) != 0 {
				t.Fatal("a rejected message reached the broker")
			}
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the rejected message never went dead")
}
