// Package postboxprom exports postbox's measurements to Prometheus.
//
//	reg := prometheus.NewRegistry()
//	m, err := postboxprom.New(reg)
//	client, err := postbox.NewClient(driver, &postbox.Config{Publisher: pub, Metrics: m}) // relay and inbox
//	reg.MustRegister(postboxprom.NewStatusCollector(client.Admin(), 2*time.Second))
//	reg.MustRegister(postboxprom.NewConsumerCollector(client.Inbox(), 2*time.Second)) // consumers' dead messages
//	idem, err := postboxidem.New(driver, &postboxidem.Config{Metrics: m}) // idempotency outcomes
//
// Alert rules and a Grafana dashboard over these metrics are in the
// repository's deploy/ directory.
//
// Every metric, its type and labels are listed in METRICS.md at the root
// of the repository.
package postboxprom

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-go/postbox"
)

// Metrics implements postbox.Metrics with Prometheus collectors.
type Metrics struct {
	published, failed, dead *prometheus.CounterVec
	fenced, infra           prometheus.Counter
	batchSize, batchSeconds prometheus.Histogram
	lag                     prometheus.Histogram
	inbox                   *prometheus.CounterVec
	handlerSeconds          *prometheus.HistogramVec
	inboxBatches            *prometheus.CounterVec
	inboxBatchSize          *prometheus.HistogramVec
	inboxBatchSeconds       *prometheus.HistogramVec
	idempotency             *prometheus.CounterVec
	paused                  prometheus.Gauge

	mu          sync.Mutex
	pausedRelay map[string]bool
}

var (
	_ postbox.Metrics           = (*Metrics)(nil)
	_ postbox.InboxTopicMetrics = (*Metrics)(nil)
	_ postbox.InboxBatchMetrics = (*Metrics)(nil)
)

// New makes the collectors and registers them with reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_published_total", Help: "Messages the broker acknowledged and the relay marked published.",
		}, []string{"topic"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_publish_failures_total", Help: "Publishes that failed as message failures (an attempt spent).",
		}, []string{"topic"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_dead_total", Help: "Messages moved to the dead table after their attempt budget.",
		}, []string{"topic"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_fenced_marks_total", Help: "Acknowledged messages whose mark was refused because the partition's lease had moved on (they are sent again).",
		}),
		infra: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "postbox_relay_infrastructure_failures_total", Help: "Batches stopped by an infrastructure failure (broker unreachable, timeout); no attempt spent.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_batch_size", Help: "Rows read per relay batch.",
			Buckets: []float64{1, 5, 10, 50, 100, 250, 500, 1000, 5000},
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_batch_duration_seconds", Help: "Relay batch duration, from the read to the end of the marks.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "postbox_commit_to_ack_seconds", Help: "Time from a message's insert to the broker's ack (database clock to relay clock).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20),
		}),
		inbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_deliveries_total", Help: "Deliveries processed by the inbox, by consumer, topic and outcome: processed, duplicate, retry, dead_lettered.",
		}, []string{"consumer", "topic", "outcome"}),
		idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_idempotency_requests_total",
			Help: "Requests the Idempotency-Key middleware handled, by outcome: completed, released, replayed, in_progress, mismatch, invalid, taken_over, store_unavailable, no_key.",
		}, []string{"outcome"}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "postbox_relays_paused", Help: "Relays of this process whose last batch stopped on an infrastructure failure: they publish nothing until the broker answers.",
		}),
		handlerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "postbox_inbox_handle_seconds", Help: "Time to process one delivery: transaction, inbox record, handler, commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"consumer"}),
		inboxBatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "postbox_inbox_batches_total", Help: "Batches of a batch processor, by consumer and outcome: alone (one delivery), committed (first transaction), second_pass (a handler failed; the batch ran again, a savepoint a delivery), one_by_one (the transaction failed; each delivery on its own).",
		}, []string{"consumer", "outcome"}),
		inboxBatchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "postbox_inbox_batch_size", Help: "Deliveries a batch processor's transaction recorded: the messages one commit serves.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}, []string{"consumer"}),
		inboxBatchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "postbox_inbox_batch_duration_seconds", Help: "Time from a batch's start to its deliveries' verdicts: its transactions, and the deliveries processed one by one after a failed one.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"consumer"}),
	}
	for _, c := range []prometheus.Collector{m.published, m.failed, m.dead, m.fenced, m.infra, m.batchSize, m.batchSeconds, m.lag, m.inbox,
		m.handlerSeconds, m.inboxBatches, m.inboxBatchSize, m.inboxBatchSeconds, m.idempotency, m.paused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RelayBatch implements postbox.Metrics.
func (m *Metrics) RelayBatch(r *postbox.BatchReport) {
	m.batchSize.Observe(float64(r.Size))
	m.batchSeconds.Observe(r.Duration.Seconds())
	for topic, n := range r.Published {
		m.published.WithLabelValues(topic).Add(float64(n))
	}
	for topic, n := range r.Failed {
		m.failed.WithLabelValues(topic).Add(float64(n))
	}
	for topic, n := range r.Dead {
		m.dead.WithLabelValues(topic).Add(float64(n))
	}
	if r.FencedOut > 0 {
		m.fenced.Add(float64(r.FencedOut))
	}
	if r.Infrastructure != nil {
		m.infra.Inc()
	}
	m.pause(r)
	for _, d := range r.Lag {
		m.lag.Observe(max(d, 0).Seconds())
	}
}

// pause tracks which relays are paused: from a batch stopped by an
// infrastructure failure to the next batch that publishes.
func (m *Metrics) pause(r *postbox.BatchReport) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pausedRelay == nil {
		m.pausedRelay = map[string]bool{}
	}
	switch {
	case r.Infrastructure != nil:
		m.pausedRelay[r.Relay] = true
	case len(r.Published) > 0 || len(r.Failed) > 0:
		delete(m.pausedRelay, r.Relay)
	}
	m.paused.Set(float64(len(m.pausedRelay)))
}

// IdempotencyOutcome implements postboxidem.Metrics.
func (m *Metrics) IdempotencyOutcome(outcome string) {
	m.idempotency.WithLabelValues(outcome).Inc()
}

// InboxHandled implements postbox.Metrics, for a delivery whose topic is
// not known; the inbox itself calls InboxHandledTopic.
func (m *Metrics) InboxHandled(consumer string, v postbox.Verdict, took time.Duration) {
	m.InboxHandledTopic(consumer, "", v, took)
}

// InboxHandledTopic implements postbox.InboxTopicMetrics.
func (m *Metrics) InboxHandledTopic(consumer, topic string, v postbox.Verdict, took time.Duration) {
	outcome := "processed"
	switch {
	case v.Action == postbox.Ack && v.Duplicate:
		outcome = "duplicate"
	case v.Action == postbox.Retry:
		outcome = "retry"
	case v.Action == postbox.DeadLettered:
		outcome = "dead_lettered"
	}
	m.inbox.WithLabelValues(consumer, topic, outcome).Inc()
	m.handlerSeconds.WithLabelValues(consumer).Observe(took.Seconds())
}

// InboxBatch implements postbox.InboxBatchMetrics.
func (m *Metrics) InboxBatch(r *postbox.InboxBatchReport) {
	m.inboxBatches.WithLabelValues(r.Consumer, r.Outcome.String()).Inc()
	m.inboxBatchSize.WithLabelValues(r.Consumer).Observe(float64(r.Size))
	m.inboxBatchSeconds.WithLabelValues(r.Consumer).Observe(r.Duration.Seconds())
}

// StatusCollector reads the outbox's state from the database each time it
// is scraped: pending, oldest pending age and dead, overall and per topic,
// on the database clock.
type StatusCollector struct {
	admin   *postbox.Admin
	timeout time.Duration
	log     *slog.Logger
	routed  func(topic string) bool

	pending, age, dead, heldSnapshot, topicPending, topicAge, topicDead, up *prometheus.Desc
	topicUnrouted, unroutedPending, partitionsUnowned, relaysLive           *prometheus.Desc
}

// NewStatusCollector returns a collector over admin; each scrape's query
// gets timeout.
func NewStatusCollector(admin *postbox.Admin, timeout time.Duration) *StatusCollector {
	return &StatusCollector{
		admin: admin, timeout: timeout, log: slog.Default(),
		pending:      prometheus.NewDesc("postbox_pending", "Messages waiting to be published.", nil, nil),
		age:          prometheus.NewDesc("postbox_oldest_pending_age_seconds", "Age of the oldest pending message (database clock).", nil, nil),
		heldSnapshot: prometheus.NewDesc("postbox_held_snapshot_age_seconds", "Age of the oldest transaction of another session holding a snapshot, which keeps vacuum from removing the outbox's dead rows; 0 when none (PostgreSQL only).", nil, nil),
		dead:         prometheus.NewDesc("postbox_dead", "Messages in the dead table.", nil, nil),
		topicPending: prometheus.NewDesc("postbox_topic_pending", "Messages waiting to be published, per topic.", []string{"topic"}, nil),
		topicAge:     prometheus.NewDesc("postbox_topic_oldest_pending_age_seconds", "Age of the oldest pending message, per topic.", []string{"topic"}, nil),
		topicDead:    prometheus.NewDesc("postbox_topic_dead", "Messages in the dead table, per topic.", []string{"topic"}, nil),
		up:           prometheus.NewDesc("postbox_status_up", "1 when the last scrape could read the outbox's state, else 0.", nil, nil),
		topicUnrouted: prometheus.NewDesc("postbox_topic_unrouted",
			"1 for a topic with pending messages that no route of this relay takes: they wait, spending no attempt, for a relay that routes them.", []string{"topic"}, nil),
		partitionsUnowned: prometheus.NewDesc("postbox_partitions_unowned",
			"Partitions no relay holds a live lease on (database clock): their messages wait. All of them while no relay runs; briefly some while leases move.", nil, nil),
		relaysLive: prometheus.NewDesc("postbox_relays_live", "Relays whose heartbeat is live, on every host (database clock).", nil, nil),
		unroutedPending: prometheus.NewDesc("postbox_unrouted_pending",
			"Pending messages of topics no route of this relay takes (included in postbox_pending).", nil, nil),
	}
}

// WithRouted makes the collector tell routed topics from unrouted ones:
// routed(topic) reports whether a route of the relay takes topic. It
// then exports postbox_topic_unrouted and postbox_unrouted_pending.
// It returns c.
func (c *StatusCollector) WithRouted(routed func(topic string) bool) *StatusCollector {
	c.routed = routed
	return c
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.age, c.dead, c.heldSnapshot, c.topicPending, c.topicAge, c.topicDead, c.up,
		c.partitionsUnowned, c.relaysLive} {
		ch <- d
	}
	if c.routed != nil {
		ch <- c.topicUnrouted
		ch <- c.unroutedPending
	}
}

// Collect implements prometheus.Collector.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.admin.Status(ctx)
	if err != nil {
		c.log.Warn("postboxprom: could not read the outbox's state", slog.Any("error", err))
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, st.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(st.Dead))
	var held float64
	if st.HeldSnapshot != nil {
		held = st.HeldSnapshot.Age.Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.heldSnapshot, prometheus.GaugeValue, held)
	ch <- prometheus.MustNewConstMetric(c.partitionsUnowned, prometheus.GaugeValue, float64(st.Partitions.Unowned))
	ch <- prometheus.MustNewConstMetric(c.relaysLive, prometheus.GaugeValue, float64(st.Partitions.Relays))
	var unrouted int64
	for _, t := range st.Topics {
		ch <- prometheus.MustNewConstMetric(c.topicPending, prometheus.GaugeValue, float64(t.Pending), t.Topic)
		ch <- prometheus.MustNewConstMetric(c.topicAge, prometheus.GaugeValue, t.OldestPendingAge.Seconds(), t.Topic)
		ch <- prometheus.MustNewConstMetric(c.topicDead, prometheus.GaugeValue, float64(t.Dead), t.Topic)
		if c.routed != nil && t.Pending > 0 && !c.routed(t.Topic) {
			unrouted += t.Pending
			ch <- prometheus.MustNewConstMetric(c.topicUnrouted, prometheus.GaugeValue, 1, t.Topic)
		}
	}
	if c.routed != nil {
		ch <- prometheus.MustNewConstMetric(c.unroutedPending, prometheus.GaugeValue, float64(unrouted))
	}
}

// DeadStats is what a ConsumerCollector reads: *postbox.Inbox[TTx]
// implements it, for any TTx.
type DeadStats interface {
	DeadStats(ctx context.Context) ([]postbox.ConsumerDeadStat, error)
}

// ConsumerCollector reads the consumers' dead messages from the database
// each time it is scraped: how many per consumer and topic, and how many
// of them wait for a requeue an operator asked for.
type ConsumerCollector struct {
	src     DeadStats
	timeout time.Duration
	log     *slog.Logger

	dead, requested, up *prometheus.Desc
}

// NewConsumerCollector returns a collector over src (an Inbox); each
// scrape's query gets timeout.
func NewConsumerCollector(src DeadStats, timeout time.Duration) *ConsumerCollector {
	return &ConsumerCollector{
		src: src, timeout: timeout, log: slog.Default(),
		dead: prometheus.NewDesc("postbox_consumer_dead", "Consumers' dead messages, per consumer and topic: their handler gave up after its budget.",
			[]string{"consumer", "topic"}, nil),
		requested: prometheus.NewDesc("postbox_consumer_dead_requeue_requested",
			"Consumers' dead messages an operator asked to requeue that the consumer's Inbox has not carried out yet.", []string{"consumer", "topic"}, nil),
		up: prometheus.NewDesc("postbox_consumer_status_up", "1 when the last scrape could read the consumers' dead messages, else 0.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ConsumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.dead
	ch <- c.requested
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *ConsumerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	stats, err := c.src.DeadStats(ctx)
	if err != nil {
		c.log.Warn("postboxprom: could not read the consumers' dead messages", slog.Any("error", err))
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for _, s := range stats {
		ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(s.Count), s.Consumer, s.Topic)
		ch <- prometheus.MustNewConstMetric(c.requested, prometheus.GaugeValue, float64(s.RequeueRequested), s.Consumer, s.Topic)
	}
}

// NewShardUp returns postbox_shard_up, a gauge read at scrape: 1 while up
// reports true, else 0. A program relaying several databases (postbox
// relay) registers one per database, under a shard label, with up true
// while that database's relay runs and the database answers.
func NewShardUp(up func() bool) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "postbox_shard_up",
		Help: "1 while the shard's relay runs and its database answers, else 0 (a shard down at start is retried with backoff).",
	}, func() float64 {
		if up() {
			return 1
		}
		return 0
	})
}
