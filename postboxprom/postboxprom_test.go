package postboxprom_test

import (
	"context"
	"errors"
	"fmt"
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
	reg.MustRegister(postboxprom.NewConsumerCollector(inbox, 2*time.Second))

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
# HELP postbox_inbox_deliveries_total Deliveries processed by the inbox, by consumer, topic and outcome: processed, duplicate, retry, dead_lettered.
# TYPE postbox_inbox_deliveries_total counter
postbox_inbox_deliveries_total{consumer="ledger",outcome="dead_lettered",topic="orders.paid"} 1
postbox_inbox_deliveries_total{consumer="ledger",outcome="duplicate",topic="orders.created"} 1
postbox_inbox_deliveries_total{consumer="ledger",outcome="processed",topic="orders.created"} 1
# HELP postbox_consumer_dead Consumers' dead messages, per consumer and topic: their handler gave up after its budget.
# TYPE postbox_consumer_dead gauge
postbox_consumer_dead{consumer="ledger",topic="orders.paid"} 1
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
		"postbox_pending", "postbox_dead", "postbox_topic_pending", "postbox_consumer_dead"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postbox_partitions_unowned", "postbox_relays_live", "postbox_consumer_status_up"} {
		if n := testutil.CollectAndCount(reg, name); n != 1 {
			t.Fatalf("%s series = %d", name, n)
		}
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

// A relay paused by an infrastructure failure counts until it publishes
// again; idempotency outcomes are counted by outcome.
func TestPausedAndIdempotency(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := postboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	down := errors.New("broker down")
	for _, r := range []*postbox.BatchReport{
		{Relay: "a", Infrastructure: down}, {Relay: "b", Infrastructure: down}, {Relay: "a", Infrastructure: down}, {Relay: "b"},
	} {
		m.RelayBatch(r)
	}
	if v := testutil.ToFloat64(gauge(t, reg, "postbox_relays_paused")); v != 2 {
		t.Fatalf("paused = %v, want 2", v)
	}
	m.RelayBatch(&postbox.BatchReport{Relay: "a", Published: map[string]int{"t": 1}})
	if v := testutil.ToFloat64(gauge(t, reg, "postbox_relays_paused")); v != 1 {
		t.Fatalf("paused after a publish = %v, want 1", v)
	}
	m.IdempotencyOutcome("replayed")
	m.IdempotencyOutcome("replayed")
	m.IdempotencyOutcome("completed")
	want := `
# HELP postbox_idempotency_requests_total Requests the Idempotency-Key middleware handled, by outcome: completed, released, replayed, in_progress, mismatch, invalid, taken_over, store_unavailable, no_key.
# TYPE postbox_idempotency_requests_total counter
postbox_idempotency_requests_total{outcome="completed"} 1
postbox_idempotency_requests_total{outcome="replayed"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "postbox_idempotency_requests_total"); err != nil {
		t.Fatal(err)
	}
}

// A batch processor's batches are counted by outcome, their sizes and
// durations observed per consumer.
func TestInboxBatches(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := postboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*postbox.InboxBatchReport{
		{Consumer: "ledger", Size: 32, Outcome: postbox.BatchCommitted, Duration: 3 * time.Millisecond},
		{Consumer: "ledger", Size: 20, Copies: 2, Outcome: postbox.BatchCommitted, Duration: 2 * time.Millisecond},
		{Consumer: "ledger", Size: 1, Outcome: postbox.BatchAlone, Duration: time.Millisecond},
		{Consumer: "ledger", Size: 12, Outcome: postbox.BatchSecondPass, Duration: 9 * time.Millisecond},
		{Consumer: "mailer", Size: 3, Outcome: postbox.BatchOneByOne, Duration: 40 * time.Millisecond},
	} {
		m.InboxBatch(r)
	}
	want := `
# HELP postbox_inbox_batches_total Batches of a batch processor, by consumer and outcome: alone (one delivery), committed (first transaction), second_pass (a handler failed; the batch ran again, a savepoint a delivery), one_by_one (the transaction failed; each delivery on its own).
# TYPE postbox_inbox_batches_total counter
postbox_inbox_batches_total{consumer="ledger",outcome="alone"} 1
postbox_inbox_batches_total{consumer="ledger",outcome="committed"} 2
postbox_inbox_batches_total{consumer="ledger",outcome="second_pass"} 1
postbox_inbox_batches_total{consumer="mailer",outcome="one_by_one"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "postbox_inbox_batches_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Per consumer: the sizes' and the durations' count and sum.
	got := map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && strings.HasPrefix(mf.GetName(), "postbox_inbox_batch_") {
				got[mf.GetName()+" "+m.GetLabel()[0].GetValue()] = fmt.Sprint(h.GetSampleCount(), " ", h.GetSampleSum())
			}
		}
	}
	for k, v := range map[string]string{
		"postbox_inbox_batch_size ledger": "4 65", "postbox_inbox_batch_size mailer": "1 3",
		"postbox_inbox_batch_duration_seconds ledger": "4 0.015", "postbox_inbox_batch_duration_seconds mailer": "1 0.04",
	} {
		if got[k] != v {
			t.Errorf("%s: count and sum %q, want %q", k, got[k], v)
		}
	}
}

// gauge returns the one metric named name in reg, as a collector.
func gauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "x", nil, nil), prometheus.GaugeValue, mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
	})
}

type collectorFunc func(ch chan<- prometheus.Metric)

func (f collectorFunc) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(f, ch) }
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }
