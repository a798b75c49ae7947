package postboxprom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxprom"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	reg := prometheus.NewRegistry()
	m, err := postboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		if string(env.Payload) == "poison" {
			return postbox.NewMessageError(errors.New("rejected"))
		}
		return nil
	})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, Metrics: m, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx,
		postbox.Message{Topic: "orders.created"}, postbox.Message{Topic: "orders.created"},
		postbox.Message{Topic: "orders.paid", Payload: []byte("poison")},
	); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the poison message's two attempts need a backoff between them
		if _, err := c.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	adminClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminClient.Admin()
	if err := c.Write(ctx, postbox.Message{Topic: "orders.shipped"}); err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(postboxprom.NewStatusCollector(admin, 2*time.Second))

	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Metrics: m, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	id := postbox.NewID()
	for range 2 {
		inbox.Handle(ctx, "ledger", &postbox.Delivery{ID: id, Topic: "orders.created"}, func(context.Context, pgx.Tx, *postbox.Delivery) error { return nil })
	}
	inbox.Handle(ctx, "ledger", &postbox.Delivery{ID: postbox.NewID(), Topic: "orders.paid"}, func(context.Context, pgx.Tx, *postbox.Delivery) error { return errors.New("no") })

	want := `
# HELP postbox_published_total Messages the broker acknowledged and the relay marked published.
# TYPE postbox_published_total counter
postbox_published_total{topic="orders.created"} 2
# HELP postbox_publish_failures_total Publishes that failed as message failures (an attempt spent).
# TYPE postbox_publish_failures_total counter
postbox_publish_failures_total{topic="orders.paid"} 2
# HELP postbox_dead_total Messages moved to the dead table after their attempt budget.
# TYPE postbox_dead_total counter
postbox_dead_total{topic="orders.paid"} 1
# HELP postbox_inbox_deliveries_total Deliveries processed by the inbox, by outcome: processed, duplicate, retry, dead_lettered.
# TYPE postbox_inbox_deliveries_total counter
postbox_inbox_deliveries_total{consumer="ledger",outcome="dead_lettered"} 1
postbox_inbox_deliveries_total{consumer="ledger",outcome="duplicate"} 1
postbox_inbox_deliveries_total{consumer="ledger",outcome="processed"} 1
# HELP postbox_pending Messages waiting to be published.
# TYPE postbox_pending gauge
postbox_pending 1
# HELP postbox_dead Messages in the dead table.
# TYPE postbox_dead gauge
postbox_dead 1
# HELP postbox_topic_pending Messages waiting to be published, per topic.
# TYPE postbox_topic_pending gauge
postbox_topic_pending{topic="orders.created"} 0
postbox_topic_pending{topic="orders.paid"} 0
postbox_topic_pending{topic="orders.shipped"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"postbox_published_total", "postbox_publish_failures_total", "postbox_dead_total", "postbox_inbox_deliveries_total",
		"postbox_pending", "postbox_dead", "postbox_topic_pending"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "postbox_held_snapshot_age_seconds"); n != 1 {
		t.Fatalf("held snapshot gauge series = %d", n)
	}
	if n := testutil.CollectAndCount(reg, "postbox_commit_to_ack_seconds"); n != 1 {
		t.Fatalf("lag histogram series = %d", n)
	}
	mf, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range mf {
		if f.GetName() == "postbox_commit_to_ack_seconds" && f.GetMetric()[0].GetHistogram().GetSampleCount() != 2 {
			t.Fatalf("lag samples = %d, want 2", f.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
}
