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

// InboxBatchMetrics is an optional extension of Metrics: when the
// Config's Metrics implements it, a batch processor
// (Inbox.BatchProcessor, Inbox.BatchHandlerProcessor) reports each batch
// it ran through InboxBatch, after its deliveries' verdicts went to
// InboxHandledTopic (or InboxHandled). A redelivery that the processor
// runs on its own (Config.MaxCrashes) forms no batch and is not reported.
type InboxBatchMetrics interface {
	InboxBatch(r *InboxBatchReport)
}

// InboxBatchReport describes one batch of a batch processor.
type InboxBatchReport struct {
	Consumer string
	// Size counts the deliveries the batch's transaction recorded: the
	// first copy of each id in it. Copies counts the other copies of an id
	// in the same batch, which went through the inbox on their own after
	// the batch.
	Size, Copies int
	// Outcome says how the batch ended.
	Outcome InboxBatchOutcome
	// Duration runs from the batch's start, once formed, to its
	// deliveries' verdicts: its transactions and, after a failed
	// transaction, the deliveries processed one by one. A batch's wait for
	// more deliveries (BatchConfig.MaxWait) is not in it.
	Duration time.Duration
}

// InboxBatchOutcome says how a batch ended: "alone", "committed",
// "second_pass" or "one_by_one" (String).
type InboxBatchOutcome int

// The outcomes of a batch.
const (
	// BatchAlone is a batch of one delivery, processed as Inbox.Handle
	// processes it.
	BatchAlone InboxBatchOutcome = iota
	// BatchCommitted is a batch whose first transaction committed: no
	// handler failed, and none ran in a savepoint.
	BatchCommitted
	// BatchSecondPass is a batch whose first transaction a handler failed:
	// it ran again in a second transaction, each handler in a savepoint
	// (for a BatchHandler, a call a delivery), and only what failed there
	// was rolled back. A batch processor that ends most of its batches so
	// does twice the work: see what its handlers fail on.
	BatchSecondPass
	// BatchOneByOne is a batch whose transaction itself failed (a
	// deadlock, a lost connection, a failed commit): nothing of it
	// committed, and each delivery went through the inbox on its own.
	BatchOneByOne
)

// String returns the outcome's name, the label postboxprom gives it.
func (o InboxBatchOutcome) String() string {
	switch o {
	case BatchAlone:
		return "alone"
	case BatchCommitted:
		return "committed"
	case BatchSecondPass:
		return "second_pass"
	case BatchOneByOne:
		return "one_by_one"
	}
	return "unknown"
}

// inboxBatch reports a batch to m when m takes it.
func inboxBatch(m Metrics, r *InboxBatchReport) {
	if m, ok := m.(InboxBatchMetrics); ok {
		m.InboxBatch(r)
	}
}
