package postbox

import "time"

// Metrics receives measurements from the relay and the inbox. The core
// depends on no metrics library: an adapter (postboxprom for Prometheus)
// implements this interface and is set in Config.Metrics. Methods are called from the relay's lanes and the
// subscribers' goroutines at once, and must be quick.
//
// Gauges that describe the tables (pending, oldest pending age, dead) are
// not pushed here: an adapter reads them from Admin.Status when it is
// scraped, on the database clock.
type Metrics interface {
	// RelayBatch reports one batch: what was read, published, failed and
	// buried, per topic.
	RelayBatch(r *BatchReport)
	// InboxHandled reports one delivery processed by Inbox.Handle.
	InboxHandled(consumer string, v Verdict, took time.Duration)
}

// BatchReport describes one relay batch. Maps and slices belong to the
// call: an adapter must not keep them.
type BatchReport struct {
	Relay    string
	Size     int           // rows read
	Duration time.Duration // from the read to the end of the marks; to the last acknowledgement for a small batch whose mark waited for the next read (postboxdriver.SettleFetcher), whether it then went with that read or alone
	// Published, Failed and Dead count rows by topic: acknowledged and
	// marked; failed as message failures (an attempt spent); moved to the
	// dead table in this batch.
	Published map[string]int
	Failed    map[string]int
	Dead      map[string]int
	// FencedOut counts acknowledged rows whose mark changed nothing: the
	// partition's lease had passed to another relay, which sends them again.
	FencedOut int
	// Infrastructure is the batch's infrastructure failure, if any: the
	// relay pauses after it, and nothing of the batch spent an attempt.
	Infrastructure error
	// Lag holds, for each acknowledged row, the time from its insert (the
	// database's created_at) to the broker's ack (the relay host's clock):
	// the commit-to-ack latency, give or take the two clocks' offset.
	Lag []time.Duration
}

// InboxTopicMetrics is an optional extension of Metrics: when the
// Config's Metrics implements it, the inbox reports each delivery with
// its topic through InboxHandledTopic instead of InboxHandled.
type InboxTopicMetrics interface {
	// InboxHandledTopic reports one delivery of topic processed for
	// consumer by Inbox.Handle or a batch processor.
	InboxHandledTopic(consumer, topic string, v Verdict, took time.Duration)
}

// inboxHandled reports a delivery to m, with its topic when m takes it.
func inboxHandled(m Metrics, consumer, topic string, v Verdict, took time.Duration) {
	switch m := m.(type) {
	case nil:
	case InboxTopicMetrics:
		m.InboxHandledTopic(consumer, topic, v, took)
	default:
		m.InboxHandled(consumer, v, took)
	}
}
