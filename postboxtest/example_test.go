package postboxtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxsqlite"
	"github.com/postbox-go/postbox/postboxtest"
)

// openExampleDB opens a migrated SQLite database in a temporary directory;
// done closes and removes it.
func openExampleDB() (*postboxsqlite.Driver, func()) {
	dir, err := os.MkdirTemp("", "postboxtest-example-")
	if err != nil {
		panic(err)
	}
	db, err := postboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	driver, err := postboxsqlite.New(db)
	if err != nil {
		panic(err)
	}
	m, err := postboxmigrate.New(driver, nil)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		panic(err)
	}
	return driver, func() { _ = db.Close(); _ = os.RemoveAll(dir) }
}

// A test of code that writes messages: the in-memory broker stands in for
// NATS or RabbitMQ, and Drain runs the relay until nothing is left.
func Example() {
	driver, done := openExampleDB()
	defer done()
	ctx := context.Background()

	broker := postboxtest.NewBroker(nil)
	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: broker})
	if err != nil {
		panic(err)
	}
	// The code under test writes in its own transaction.
	if err := client.Write(ctx, postbox.Message{Topic: "orders.created", Key: "order-1", Payload: []byte(`{"total":42}`)}); err != nil {
		panic(err)
	}
	res, err := client.Drain(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("published:", res.Published)
	for _, env := range broker.Messages() {
		fmt.Println(env.Topic, env.Key, string(env.Payload))
	}
	// Output:
	// published: 1
	// orders.created order-1 {"total":42}
}

// A broker outage: Drain stops at the infrastructure failure, nothing is
// lost and no attempt is spent; once the broker is back, everything goes.
func ExampleBroker_SetDown() {
	driver, done := openExampleDB()
	defer done()
	ctx := context.Background()

	broker := postboxtest.NewBroker(nil)
	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: broker})
	if err != nil {
		panic(err)
	}
	if err := client.Write(ctx, postbox.Message{Topic: "orders.paid"}, postbox.Message{Topic: "orders.paid"}); err != nil {
		panic(err)
	}
	broker.SetDown(true)
	_, err = client.Drain(ctx)
	fmt.Println("while down:", err)
	broker.SetDown(false)
	res, err := client.Drain(ctx)
	fmt.Println("after:", res.Published, "published,", res.Dead, "dead,", err)
	fmt.Println("attempt of the first publish:", broker.Messages()[0].Attempt)
	// Output:
	// while down: postbox: drain: postboxtest: broker down
	// after: 2 published, 0 dead, <nil>
	// attempt of the first publish: 1
}

// A test of a consumer: the broker's subscriber feeds the inbox, which
// runs the handler once per message id, even for a copy.
func ExampleBroker_Subscriber() {
	driver, done := openExampleDB()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	broker := postboxtest.NewBroker(&postboxtest.BrokerOptions{DedupeWindow: -1})
	env := &postbox.Envelope{ID: postbox.NewID(), Topic: "orders.paid", Key: "order-1", Payload: []byte("paid")}
	for range 2 { // the second is a copy, as after a relay crash
		broker.Publish(ctx, env, func(error) {})
	}

	client, err := postbox.NewClient(driver, nil)
	if err != nil {
		panic(err)
	}
	inbox := client.Inbox()
	handled := make(chan string, 2)
	sub := broker.Subscriber("ledger", nil)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = sub.Run(ctx, inbox.Processor("ledger", func(_ context.Context, _ *sql.Tx, d *postbox.Delivery) error {
			handled <- d.Key + " " + string(d.Payload)
			return nil
		}))
	}()
	fmt.Println(<-handled)
	for len(broker.Settled("ledger")) < 2 { // both copies settled
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-stopped
	fmt.Println("handler runs:", 1+len(handled))
	// Output:
	// order-1 paid
	// handler runs: 1
}
