package postbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Config configures a Client: the writer, the relay, the inbox and the
// operator side share it, so a setting they have in common is set once.
// The zero value of every field means its default, documented on the
// field; WithDefaults fills them in and Validate checks the result, naming
// every bad field at once.
type Config struct {
	// Prefix names the tables: {Prefix}outbox, {Prefix}published, ...
	// Lower-case letters, digits and underscores, at most 32 characters.
	// Default "postbox_".
	Prefix string

	// Logger receives the relay's and the inbox's logs. Default
	// slog.Default().
	Logger *slog.Logger

	// Metrics, when set, receives a report of every relay batch and of
	// every delivery the inbox handles.
	Metrics Metrics

	// Tracer, when set, stores the writer's trace context with each
	// message, traces each publish, and runs each handler in a span that
	// continues the writer's trace (postboxotel).
	Tracer Tracer

	// Writing.

	// Source is the CloudEvents source of messages that set none. Default
	// "postbox".
	Source string

	// MaxPayloadBytes caps a message's payload. Default 1 MiB.
	MaxPayloadBytes int

	// Validator, when set, checks each payload before the insert, e.g.
	// against a JSON Schema per topic (package postboxschema).
	Validator PayloadValidator

	// Publishing: the relay.

	// Publisher sends messages to the broker. A Client without one (and
	// without Routes) can write, consume and operate, but Start refuses to
	// run a relay.
	Publisher Publisher

	// Routes send topics to publishers: one relay can feed several
	// brokers. The first route whose pattern matches a topic wins; with
	// Publisher set too, it takes every topic no route matches. A relay
	// reads only the topics it has a route for: rows of other topics
	// (written by another service, or by a newer version during a rolling
	// deploy) wait for a relay that knows them, spending no attempt, and
	// hold back the later messages of their key. A Client with routes and
	// no Publisher refuses to write a topic no route matches.
	Routes []Route

	// BatchSize is the most rows the relay reads at once. Default 500.
	BatchSize int
	// PublishWindow is the most publishes awaiting the broker's ack at
	// once, across the relay's lanes. Default 256.
	PublishWindow int
	// Lanes is how many batches a relay holding every partition works on
	// at once, each lane over its own share of the relay's partitions, so
	// that one lane's database round trips overlap another's publishing.
	// A relay holding part of the partitions reads with that part of
	// Lanes, rounded up and at least one (two relays with the default 4
	// read with 2 each), and follows its share as relays join and leave:
	// relays sharing a table bring about Lanes to it together rather than
	// Lanes each, since past what the database and the cores serve more
	// concurrent batches drain more slowly. They read only while the
	// load needs them: one lane reads the whole share until a batch comes
	// back full (BatchSize rows), then all of them, until none has for
	// 2s; at a trickle one lane's batch carries in one statement what
	// several lanes would read in as many. Each lane uses a database
	// connection while it reads or marks; with the renewals, the idle
	// probe and the maintenance pass, a relay uses up to Lanes+3 at once,
	// and a pool smaller than that delays renewals. Default 4.
	Lanes int
	// LeaseDuration is how long a relay holds its partitions without
	// renewing them; it renews every eighth of it. A crashed relay's
	// partitions move to another replica between seven eighths of a lease
	// and a lease after the crash; a relay paused (or cut off from the
	// database) for less than seven eighths of a lease keeps them.
	// Default 4s.
	LeaseDuration time.Duration
	// BatchDeadline bounds one batch's publishing, and must be shorter than
	// LeaseDuration: no publish starts after it (what is not sent waits
	// for the next batch); those already sent are awaited until the lease
	// the batch was read under ends. Default a third of LeaseDuration
	// (1.33s at the default lease), at most 10s. Raise both for a broker
	// that takes seconds to acknowledge.
	BatchDeadline time.Duration
	// PollInterval is the longest the relay waits between looks at an idle
	// outbox. Writes through this Client wake it at once, and, on a
	// database that carries change signals (PostgreSQL's LISTEN/NOTIFY
	// through postboxpgx), so do writes through any Client in another
	// process. Default 100ms.
	PollInterval time.Duration
	// NoSignals turns the change signals between processes off: writes
	// send none, and the relay listens for none, finding rows written by
	// other processes by polling alone. A Client sends at most one
	// pg_notify every 5ms, outside the writers' transactions, for all the
	// writes made meanwhile; the relay listens on one connection of its
	// own, outside the pool. A service whose only relays run in its own
	// processes, woken directly by their Client's writes, may set it to
	// spare the database those notifications.
	NoSignals bool
	// BlockOnDead keeps later messages of a key waiting while an earlier one
	// is dead, until it is requeued or deleted. By default they go on.
	BlockOnDead bool
	// RelayID names this relay in leases, logs and metrics: each Start
	// owns its leases as RelayID followed by a random suffix, so that two
	// processes given the same RelayID never pass for one another.
	// Default a new UUID per Start.
	RelayID string

	// Retries, of a publish (the relay) and of a handler run (the inbox).

	// MaxAttempts is a message's budget of failed publishes, and of failed
	// handler runs per consumer: the failure that reaches it makes the
	// message a dead message. Default 25.
	MaxAttempts int
	// MaxCrashes bounds, on both sides, the times one message may take
	// its process down before it becomes a dead message (its error names
	// the count) and its key moves on, as after any dead message (or
	// holds, with BlockOnDead on the relay). Without it, a message whose
	// publish or handler kills the process (a panic past recovery,
	// os.Exit, out of memory) would be taken up again for ever. Default
	// 3, between 1 and 1000.
	//
	// The relay: a crash counts against a message only when it was the
	// one publish in flight in its relay, which a relay arranges only for
	// the messages in flight when an earlier relay died (design §4, "A
	// message that kills the relay"); unrelated kills (a deploy's SIGKILL)
	// must land inside such a publish MaxCrashes times in a row to bury a
	// message.
	//
	// The inbox: when the broker redelivers a message whose redeliveries
	// ran and died MaxCrashes times, with no counted failure recorded in
	// between (an uncounted retry or a store failure in between does not
	// restart the count), the inbox writes it as a consumer dead message
	// instead of running it again and the subscriber acknowledges it. The
	// count needs the broker's delivery count (Delivery.Delivered) to tell
	// a redelivery: JetStream, RabbitMQ quorum queues and Redis streams
	// keep one. A first delivery records nothing, so its own crash is not
	// counted: a message that kills every run is dead-lettered on delivery
	// MaxCrashes+2, after MaxCrashes+1 exits. A redelivery whose earlier
	// run ended with the process gone runs alone in its process (other
	// handler runs wait for it), so that a crash it causes is not counted
	// against the messages that were in flight beside it: those count at
	// most the one crash they were beside, and then run alone too.
	MaxCrashes int
	// BackoffBase and BackoffMax bound the delay before the next try:
	// base·2^(failures-1) capped at max, with equal jitter (half fixed,
	// half random). Defaults 1s and 5m.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// Retention. Pending and dead outbox messages are never deleted by it.

	// Retention keeps published messages this long, for replay: it is the
	// replay horizon. The relay that holds partition 0 deletes older ones
	// every PruneInterval, in batches of PruneBatch, so one replica at a
	// time does it. Negative keeps everything. Default 7 days.
	Retention time.Duration
	// InboxRetention keeps inbox records this long. A copy that arrives
	// after its record is gone runs its handler again, so it must outlast
	// every way a copy can come: a replay, a relay's re-send. The
	// default, Retention plus a day, covers producers that keep their
	// history as long as this service does; a message from a producer
	// that keeps it longer carries that producer's horizon
	// (HeaderReplayHorizon), and its record is kept that long plus a day
	// whatever this setting says. It may not be shorter than Retention
	// plus a day. Negative keeps records forever, and is required when
	// Retention is negative.
	InboxRetention time.Duration
	// DeadRetention keeps consumers' dead messages this long. Negative
	// keeps them until they are requeued or deleted. Default 30 days.
	DeadRetention time.Duration
	// PruneInterval is the pause between retention passes. Default 1m.
	PruneInterval time.Duration
	// RequeueInterval is the pause between an Inbox's looks for requeues
	// an operator asked for (Inbox.RequestRequeue, the CLI, the admin
	// API), which Inbox.Start carries out for the consumers this process
	// has a Processor for. Default 5s.
	RequeueInterval time.Duration
	// PruneBatch bounds each retention delete. Default 1000.
	PruneBatch int
}

// PayloadValidator checks a payload before it is written.
type PayloadValidator interface {
	// ValidatePayload returns an error when payload is not acceptable for
	// topic. Return a *ValidationError to name what is wrong.
	ValidatePayload(topic string, payload []byte) error
}

// Defaults, as documented on Config.
const (
	DefaultPrefix          = "postbox_"
	DefaultSource          = "postbox"
	DefaultMaxPayloadBytes = 1 << 20
	DefaultBatchSize       = 500
	DefaultPublishWindow   = 256
	DefaultLanes           = 4
	DefaultLeaseDuration   = 4 * time.Second
	DefaultBatchDeadline   = 10 * time.Second // the most; a third of the lease when that is shorter
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultMaxAttempts     = 25
	DefaultMaxCrashes      = 3
	DefaultBackoffBase     = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultDeadRetention   = 30 * 24 * time.Hour
	DefaultPruneInterval   = time.Minute
	DefaultPruneBatch      = 1000
	DefaultRequeueInterval = 5 * time.Second

	// RedeliveryMargin is what InboxRetention must keep beyond Retention:
	// the time a copy may still take to arrive after the history that
	// could re-send it is gone (a relay's re-send, a broker's redelivery).
	RedeliveryMargin = 24 * time.Hour
)

// ValidatePrefix reports whether prefix can name tables.
func ValidatePrefix(prefix string) error {
	if !postboxdriver.ValidPrefix(prefix) {
		return invalid("Prefix", prefix, "must be lower-case letters, digits and _, not starting with a digit, at most %d characters", postboxdriver.MaxPrefixLen)
	}
	return nil
}

// WithDefaults returns a copy of c with every zero field set to its
// default; the defaults that follow from other fields (BatchDeadline,
// InboxRetention) follow the values given.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	def(&out.Prefix, DefaultPrefix)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	def(&out.Source, DefaultSource)
	def(&out.MaxPayloadBytes, DefaultMaxPayloadBytes)
	def(&out.BatchSize, DefaultBatchSize)
	def(&out.PublishWindow, DefaultPublishWindow)
	def(&out.Lanes, DefaultLanes)
	def(&out.LeaseDuration, DefaultLeaseDuration)
	def(&out.BatchDeadline, min(DefaultBatchDeadline, out.LeaseDuration/3))
	def(&out.PollInterval, DefaultPollInterval)
	def(&out.MaxAttempts, DefaultMaxAttempts)
	def(&out.MaxCrashes, DefaultMaxCrashes)
	def(&out.BackoffBase, DefaultBackoffBase)
	def(&out.BackoffMax, DefaultBackoffMax)
	def(&out.Retention, DefaultRetention)
	if out.Retention < 0 {
		def(&out.InboxRetention, -1)
	} else {
		def(&out.InboxRetention, out.Retention+RedeliveryMargin)
	}
	def(&out.DeadRetention, DefaultDeadRetention)
	def(&out.PruneInterval, DefaultPruneInterval)
	def(&out.PruneBatch, DefaultPruneBatch)
	def(&out.RequeueInterval, DefaultRequeueInterval)
	return &out
}

// def sets *p to v if *p is the zero value.
func def[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	var ps []*ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, invalid(field, value, format, args...))
	}
	if err := ValidatePrefix(c.Prefix); err != nil {
		ps = append(ps, err.(*ValidationError)) //nolint:errorlint // always this type
	}
	if len(c.Source) > MaxHeaderValueBytes || !printable.Text(c.Source) {
		bad("Source", c.Source, "must be printable text of at most %d bytes", MaxHeaderValueBytes)
	}
	between := func(field string, v, limit int) {
		if v < 1 || v > limit {
			bad(field, v, "must be between 1 and %d", limit)
		}
	}
	between("MaxPayloadBytes", c.MaxPayloadBytes, 64<<20)
	between("BatchSize", c.BatchSize, 100_000)
	between("PublishWindow", c.PublishWindow, 100_000)
	between("Lanes", c.Lanes, 64)
	between("MaxAttempts", c.MaxAttempts, 1_000_000)
	between("MaxCrashes", c.MaxCrashes, 1000)
	between("PruneBatch", c.PruneBatch, 100_000)
	atLeast := func(field string, v, least time.Duration) {
		if v < least {
			bad(field, v, "must be at least %s", least)
		}
	}
	atLeast("LeaseDuration", c.LeaseDuration, 100*time.Millisecond)
	atLeast("BatchDeadline", c.BatchDeadline, 10*time.Millisecond)
	atLeast("BackoffBase", c.BackoffBase, time.Millisecond)
	atLeast("PollInterval", c.PollInterval, time.Millisecond)
	atLeast("PruneInterval", c.PruneInterval, time.Second)
	atLeast("RequeueInterval", c.RequeueInterval, 10*time.Millisecond)
	if c.BatchDeadline >= c.LeaseDuration {
		bad("BatchDeadline", c.BatchDeadline, "must be shorter than LeaseDuration (%s), so a batch ends before its lease can pass to another relay", c.LeaseDuration)
	}
	if c.BackoffMax < c.BackoffBase {
		bad("BackoffMax", c.BackoffMax, "must not be shorter than BackoffBase (%s)", c.BackoffBase)
	}
	if c.Retention >= 0 && c.Retention < time.Hour {
		bad("Retention", c.Retention, "must be at least 1h (or negative to keep everything): replay and late consumers need the history")
	}
	switch {
	case c.Retention < 0 && c.InboxRetention >= 0:
		bad("InboxRetention", c.InboxRetention, "must be negative (keep records forever) while Retention keeps the history forever: a replay of any age can reach the inbox, and a forgotten id runs its handler twice")
	case c.Retention >= 0 && c.InboxRetention >= 0 && c.InboxRetention < c.Retention+RedeliveryMargin:
		bad("InboxRetention", c.InboxRetention, "must be at least Retention (%s) plus one day: an inbox record deleted while a copy can still arrive lets the handler run twice", c.Retention)
	}
	if c.DeadRetention >= 0 && c.DeadRetention < time.Hour {
		bad("DeadRetention", c.DeadRetention, "must be at least 1h (or negative to keep dead messages until they are handled)")
	}
	for i, r := range c.Routes {
		if err := ValidateTopicPattern(r.Topics); err != nil {
			bad(fmt.Sprintf("Routes[%d].Topics", i), r.Topics, "%s", err.(*ValidationError).Reason) //nolint:errorlint // always this type
		}
		if r.Publisher == nil {
			bad(fmt.Sprintf("Routes[%d].Publisher", i), "", "is nil")
		}
	}
	if c.RelayID != "" && (len(c.RelayID) > 200 || !printable.Text(c.RelayID)) {
		bad("RelayID", c.RelayID, "must be printable text of at most 200 bytes")
	}
	if len(ps) > 0 {
		return &ConfigError{Problems: ps}
	}
	return nil
}

func (c *Config) String() string {
	return fmt.Sprintf("prefix=%s batch=%d window=%d lanes=%d lease=%s deadline=%s backoff=%s..%s attempts=%d crashes=%d poll=%s",
		c.Prefix, c.BatchSize, c.PublishWindow, c.Lanes, c.LeaseDuration, c.BatchDeadline, c.BackoffBase, c.BackoffMax, c.MaxAttempts, c.MaxCrashes, c.PollInterval)
}
