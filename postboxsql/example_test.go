package postboxsql_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxsql"
)

// A database/sql service over the log (README, "The log"): the *sql.DB is
// made from the pgx pool that the log's own statements run on, so both
// reach one database, as the relay checks at its start. Its writes go in
// the service's *sql.Tx, to the log once the database says log (`postbox
// storage log`, after every relay of it runs over the log).
func ExampleWithLog() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	driver, err := postboxsql.New(db, postboxsql.WithLog(pool))
	if err != nil {
		log.Fatal(err)
	}
	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: postbox.PublisherFunc(
		func(_ context.Context, e *postbox.Envelope) error { log.Printf("publish %s", e.ID); return nil })})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil { // postboxdriver.ErrOtherDatabase for a pool elsewhere
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	// UPDATE orders ... with tx, then:
	if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.paid", Key: "order-42", Payload: []byte(`{"order":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}
