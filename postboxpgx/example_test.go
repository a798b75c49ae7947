package postboxpgx_test

import (
	"context"
	"log"

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
