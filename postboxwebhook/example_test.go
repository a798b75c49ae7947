package postboxwebhook_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// The signature of the Standard Webhooks reference test vector.
func ExampleSigner() {
	s, err := postboxwebhook.NewSigner("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`)))
	// Output: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

// A relay that sends the orders.* topics to a webhook.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	pub, err := postboxwebhook.New(&postboxwebhook.Config{
		Destinations: []postboxwebhook.Destination{{
			Topics: "orders.*",
			URL:    "https://billing.example.com/webhooks/orders",
			// The new secret and, until every receiver has it, the old.
			Secrets: []postboxwebhook.Secret{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_42f8XnjFtxf6YTEznrLcNrM5cmAPmyLPSZ0R4qpRFeg="},
			Timeout: 5 * time.Second,
			Headers: map[string]string{"Authorization": "Bearer billing-token"},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = pub.Close(ctx) }()
	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{
		Routes: []postbox.Route{{Topics: "orders.*", Publisher: pub}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
}

// A receiving service: verified webhooks go through its inbox, so each
// message id takes effect once.
func ExampleNewReceiver() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/billing")
	if err != nil {
		log.Fatal(err)
	}
	v, err := postboxwebhook.NewVerifier("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		log.Fatal(err)
	}
	inboxClient, err := postbox.NewClient(postboxpgx.New(pool), nil)
	if err != nil {
		log.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	handle := func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_event, body) VALUES ($1, $2)`, d.ID, d.Payload)
		return err
	}
	rc, err := postboxwebhook.NewReceiver(v, inbox.Processor("billing", handle), nil)
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /webhooks/orders", rc)
	log.Fatal(http.ListenAndServe(":8080", nil))
}
