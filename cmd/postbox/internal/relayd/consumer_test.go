package relayd_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

// The daemon serves a consumer's dead messages from the consumer's
// tables (consumer_prefix) and marks a requeue, which the consumer's own
// running Inbox, the one with the handler, carries out.
func TestDaemonConsumerRequeue(t *testing.T) {
	ctx := context.Background()
	pool, relayPrefix := testdb.Migrated(t)
	_, consumerPrefix := testdb.Migrated(t)
	_, url := embeddedNATS(t)
	d := startDaemon(t, `
databases: [{url: "`+testdb.PostgresURL()+`", prefix: `+relayPrefix+`, consumer_prefix: `+consumerPrefix+`}]
relay: {lease: 3s}
admin: {listen: "127.0.0.1:0"}
`, map[string]string{"POSTBOX_NATS_URL": url})

	service, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: consumerPrefix, MaxAttempts: 1, RequeueInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	in := service.Inbox()
	if v := in.Handle(ctx, "billing", &postbox.Delivery{ID: "m-1", Topic: "orders.paid", Payload: []byte("{}")},
		func(context.Context, pgx.Tx, *postbox.Delivery) error { return errors.New("bug") }); v.Action != postbox.DeadLettered {
		t.Fatal(v)
	}
	var list map[string]any
	if code := post(t, d, "GET", "/v1/consumers/dead", "", &list); code != 200 || len(list["dead_letters"].([]any)) != 1 {
		t.Fatalf("consumers' dead messages: %d %v", code, list)
	}
	applied := make(chan string, 1)
	in.Processor("billing", func(_ context.Context, _ pgx.Tx, d *postbox.Delivery) error {
		applied <- d.ID
		return nil
	})
	if err := in.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Stop(ctx) }()
	var marked map[string]any
	if code := post(t, d, "POST", "/v1/consumers/dead/requeue", `{"consumer": "billing", "ids": ["m-1"]}`, &marked); code != 202 || marked["count"] != 1.0 {
		t.Fatalf("requeue: %d %v", code, marked)
	}
	select {
	case id := <-applied:
		if id != "m-1" {
			t.Fatalf("handler ran for %s", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer's Inbox never ran the requeue the daemon marked")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code := post(t, d, "GET", "/v1/consumers/dead", "", &list); code == 200 && len(list["dead_letters"].([]any)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead messages after the requeue: %v", list)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// relay.consumer_dead_retention: negative keeps the consumers' dead
// messages of the tables the daemon serves until they are handled; the
// default (30 days) has the daemon delete older ones, and only those.
func TestDaemonConsumerDeadRetention(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, url := embeddedNATS(t)
	for _, tc := range []struct {
		name, setting string
		oldKept       bool
	}{
		{"kept until handled", "consumer_dead_retention: -1s", true},
		{"default", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, relayPrefix := testdb.Migrated(t)
			_, consumerPrefix := testdb.Migrated(t)
			service, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: consumerPrefix, MaxAttempts: 1, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"old", "fresh"} {
				if v := service.Inbox().Handle(ctx, "billing", &postbox.Delivery{ID: id, Topic: "orders.paid", Payload: []byte("{}")},
					func(context.Context, pgx.Tx, *postbox.Delivery) error { return errors.New("bug") }); v.Action != postbox.DeadLettered {
					t.Fatal(v)
				}
			}
			// 40 days dead: past the default retention.
			if _, err := pool.Exec(ctx, `UPDATE `+consumerPrefix+`consumer_dead SET dead_at = now() - interval '40 days' WHERE message_id = 'old'`); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, `
databases: [{url: "`+testdb.PostgresURL()+`", prefix: `+relayPrefix+`, consumer_prefix: `+consumerPrefix+`}]
relay: {lease: 3s, `+tc.setting+`}
admin: {listen: "off"}
`, map[string]string{"POSTBOX_NATS_URL": url})
			dead := func() []string {
				ds, err := service.Inbox().ListDead(ctx, postbox.DeadFilter{Consumer: "billing"})
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, m := range ds {
					ids = append(ids, m.ID)
				}
				slices.Sort(ids)
				return ids
			}
			if tc.oldKept {
				// No pass runs in the background; one run by hand deletes nothing.
				if n, err := d.PruneConsumers(ctx); n != 0 || err != nil {
					t.Fatalf("a pass deleted %d (%v)", n, err)
				}
				if got := dead(); !slices.Equal(got, []string{"fresh", "old"}) {
					t.Fatalf("dead messages %v, want both kept", got)
				}
				return
			}
			// The daemon's own pass (at start) or this one, whichever holds
			// the claim, deletes the old message.
			deadline := time.Now().Add(30 * time.Second)
			for got := dead(); !slices.Equal(got, []string{"fresh"}); got = dead() {
				if time.Now().After(deadline) {
					t.Fatalf("dead messages %v, want only the fresh one", got)
				}
				if _, err := d.PruneConsumers(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
