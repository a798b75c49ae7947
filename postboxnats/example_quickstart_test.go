package postboxnats_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
)

// The README's quick start, compiled by the tests so that it stays true:
// a service that writes an order and its event in one transaction, relays
// the events to JetStream, and consumes them through the inbox.
func Example_quickStart() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	driver := postboxpgx.New(pool)

	// Once, at deploy time (or print the SQL for your own migration tool: m.SQL()).
	m, _ := postboxmigrate.New(driver, nil)
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}

	// The stream is explicit topology: postbox never creates it as a side effect.
	js, _ := jetstream.New(nc)
	if _, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		log.Fatal(err)
	}
	pub, _ := postboxnats.New(js, nil)

	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil { // the relay, until Stop
		log.Fatal(err)
	}
	defer client.Stop(ctx)

	// In your transaction:
	orderID, body := "order-42", []byte(`{"order":42}`)
	tx, _ := pool.Begin(ctx)
	// UPDATE orders ... (lock the order row: its events are then ordered)
	err = client.WriteTx(ctx, tx, postbox.Message{
		Topic:       "orders.paid",
		Key:         orderID, // same key => published in write order
		Payload:     body,
		ContentType: "application/json",
	})
	if err != nil {
		_ = tx.Rollback(ctx)
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// The consumer side: the inbox records each message id with the
	// handler's writes, so a redelivered copy runs nothing.
	inbox := client.Inbox()
	cons, err := postboxnats.EnsureConsumer(ctx, js, "ORDERS", jetstream.ConsumerConfig{Durable: "billing", AckWait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	sub, err := postboxnats.NewSubscriber(cons, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = sub.Run(ctx, inbox.Processor("billing", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		_, err := tx.Exec(ctx, "UPDATE accounts SET paid = true WHERE order_id = $1", d.Key)
		return err
	}))
	if err != nil {
		log.Fatal(err)
	}
}
