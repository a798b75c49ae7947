package postboxpgx_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A service whose relays read the log (README, "The log"): every relay of
// the database runs with WithLog first, then an operator runs `postbox
// storage log`, and from then on this writer writes the log. Until then
// it writes the outbox, which the same relays read.
func ExampleWithLog() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	client, err := postbox.NewClient(postboxpgx.New(pool, postboxpgx.WithLog()), &postbox.Config{
		Publisher: postbox.PublisherFunc(func(_ context.Context, e *postbox.Envelope) error {
			log.Printf("publish %s %s", e.Topic, e.ID)
			return nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// UPDATE orders ... with tx, then:
	if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.paid", Key: "order-42", Payload: []byte(`{"order":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil { // the log's insert goes with the COMMIT
		log.Fatal(err)
	}
}

// A consumer that applies each batch of deliveries in one statement
// (README, "Many messages per commit"): the deliveries come ordered by key,
// so that a key's are adjacent and merge into one row of the upsert.
func Example_batchHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	client, err := postbox.NewClient(postboxpgx.New(pool), nil)
	if err != nil {
		log.Fatal(err)
	}
	count := func(ctx context.Context, tx pgx.Tx, ds []*postbox.Delivery) error {
		var keys []string
		var ns []int64
		for _, d := range ds {
			if len(keys) > 0 && keys[len(keys)-1] == d.Key {
				ns[len(ns)-1]++
				continue
			}
			keys, ns = append(keys, d.Key), append(ns, 1)
		}
		_, err := tx.Exec(ctx, `INSERT INTO order_events (order_id, n)
			SELECT * FROM unnest($1::text[], $2::bigint[])
			ON CONFLICT (order_id) DO UPDATE SET n = order_events.n + EXCLUDED.n`, keys, ns)
		return err
	}
	p, err := client.Inbox().BatchHandlerProcessor("order-stats", count, nil)
	if err != nil {
		log.Fatal(err)
	}
	// A broker's subscriber runs p: sub.Run(ctx, p).
	_ = p
}
