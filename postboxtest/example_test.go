package postboxtest_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// openExampleDB opens PostgreSQL with the postbox tables migrated in a
// schema of the example's own; done drops the schema and closes the pool.
func openExampleDB() (*postboxpgx.Driver, func()) {
	ctx := context.Background()
	schema := fmt.Sprintf("postboxtest_example_%d_%d", os.Getpid(), exampleDBs.Add(1))
	admin, err := pgx.Connect(ctx, testdb.PostgresURL())
	if err != nil {
		panic(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	driver := postboxpgx.New(pool)
	m, err := postboxmigrate.New(driver, nil)
	if err != nil {
		panic(err)
	}
	if _, err := m.Up(ctx); err != nil {
		panic(err)
	}
	return driver, func() {
		pool.Close()
		if c, err := pgx.Connect(ctx, testdb.PostgresURL()); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_ = c.Close(ctx)
		}
	}
}

var exampleDBs atomic.Int64

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
		_ = sub.Run(ctx, inbox.Processor("ledger", func(_ context.Context, _ pgx.Tx, d *postbox.Delivery) error {
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
