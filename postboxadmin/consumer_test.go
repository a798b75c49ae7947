package postboxadmin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A requeue asked for through the API reaches the consumer's service: its
// running Inbox, which has the handler, runs it through the inbox and
// removes the dead message. Delete by selection removes the rest.
func TestConsumerRequeueReachesTheService(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	// The daemon's side: no handler.
	daemon, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	a := serve(t, &postboxadmin.Config{Admin: daemon.Admin(), ConsumerDead: daemon.Inbox(), Tokens: tokens()})

	// The consumer's service: a handler that failed until it was fixed.
	service, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, MaxAttempts: 1, RequeueInterval: 10 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in := service.Inbox()
	for _, id := range []string{"m-1", "m-2", "m-3"} {
		bury(t, in, "billing", id)
	}
	bury(t, in, "shipping", "m-1")
	applied := make(chan string, 4)
	in.Processor("billing", func(_ context.Context, _ pgx.Tx, d *postbox.Delivery) error {
		applied <- d.ID
		return nil
	})
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Stop(ctx) }()

	for _, bad := range []string{`{}`, `{"ids": ["m-1"]}`, `{"consumer": "a\u0001"}`, `{"consumer": "billing", "ids": [""]}`, `{"topic": "bad topic"}`} {
		if r := a.do(t, "POST", "/v1/consumers/dead/requeue", adminToken, bad); r.status != 400 {
			t.Errorf("requeue %s: %d %s", bad, r.status, r)
		}
	}
	if r := a.do(t, "POST", "/v1/consumers/dead/requeue", readToken, `{"all": true}`); r.status != 403 {
		t.Fatalf("requeue with a read token: %d", r.status)
	}
	if r := a.must(t, 202, "POST", "/v1/consumers/dead/requeue", adminToken, `{"consumer": "billing", "ids": ["m-1", "m-2"]}`); r.json["count"] != 2.0 {
		t.Fatalf("requeue: %s", r)
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-applied:
			got[id] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("the service's Inbox ran %v of the requested requeues", got)
		}
	}
	if !got["m-1"] || !got["m-2"] {
		t.Fatalf("handler ran for %v", got)
	}
	// The dead messages leave in the handler's transaction: once both ran,
	// both are gone, or about to be committed; wait for the commits.
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := list(t, a.must(t, 200, "GET", "/v1/consumers/dead?consumer=billing", readToken, ""), "dead_letters")
		if len(left) == 1 && left[0]["message_id"] == "m-3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("billing's dead messages after the requeue: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := a.must(t, 200, "POST", "/v1/consumers/dead/delete", adminToken, `{"all": true}`); r.json["count"] != 2.0 {
		t.Fatalf("delete all: %s", r)
	}
	if left := list(t, a.must(t, 200, "GET", "/v1/consumers/dead", readToken, ""), "dead_letters"); len(left) != 0 {
		t.Fatalf("after delete: %v", left)
	}
}
