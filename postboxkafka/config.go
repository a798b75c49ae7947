package postboxkafka

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// Publisher defaults, as documented on Config.
const (
	// DefaultPublishTimeout leaves half of the relay's default batch
	// deadline (10s) for the rest of the batch: a message that times out
	// comes back as an infrastructure failure inside its batch.
	DefaultPublishTimeout = 5 * time.Second
)

// Subscriber defaults, as documented on SubscriberConfig.
const (
	DefaultMaxInFlight     = 16
	DefaultPartitionBuffer = 256
	DefaultCommitInterval  = 100 * time.Millisecond
	DefaultCommitTimeout   = 10 * time.Second
	// DefaultMaxRetryHold equals the inbox's default BackoffMax, so every
	// redelivery delay the inbox asks for at its defaults is honoured.
	DefaultMaxRetryHold = 5 * time.Minute
)

// MaxTopicNameBytes is Kafka's limit on a topic name's length.
const MaxTopicNameBytes = 249

// Bounds checked by Validate.
const (
	minPublishTimeout  = 10 * time.Millisecond
	maxPublishTimeout  = 10 * time.Minute
	maxMaxInFlight     = 4096
	maxPartitionBuffer = 1 << 20
	maxCommitInterval  = time.Minute
	maxRetryHold       = 24 * time.Hour
	maxGroupBytes      = 255
)

// Config configures a Publisher. The zero value of every field means its
// default; WithDefaults fills them in and Validate checks the result,
// naming every bad field at once.
type Config struct {
	// TopicPrefix is prepended to the postbox topic to make the Kafka
	// topic: "events." publishes "orders.created" to
	// "events.orders.created". Default "" (the Kafka topic is the topic).
	TopicPrefix string

	// Topic, when set, maps a postbox topic to its Kafka topic instead of
	// TopicPrefix. It must be a pure function of the topic: it runs for
	// every message, and a message's destination must not change between
	// its retries. Its result is checked on every publish; one that is not
	// a valid Kafka topic name fails that message (a message failure
	// wrapping ErrInvalidTopic).
	//
	// Postbox topics may hold ':', which Kafka forbids; such a topic fails
	// unless Topic maps it, e.g. with strings.ReplaceAll(t, ":", ".").
	Topic func(topic string) string

	// PublishTimeout bounds the wait for one message's acknowledgement. A
	// message without one by then fails as an infrastructure failure (it
	// may have been stored; its retry carries the same ce_id and the
	// consumers' inbox absorbs the copy). Keep it under the relay's
	// BatchDeadline. Default 5s.
	PublishTimeout time.Duration

	// Logger receives topic lookups that fail. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	configcheck.Default(&out.PublishTimeout, DefaultPublishTimeout)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *postbox.ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	var ps problems
	if p := c.TopicPrefix; p != "" {
		if err := ValidateTopicName(p); err != nil {
			ps.Add("TopicPrefix", p, "%v", strings.TrimPrefix(err.Error(), "postboxkafka: "))
		} else if len(p) >= MaxTopicNameBytes {
			ps.Add("TopicPrefix", p, "leaves no room for the topic within Kafka's %d bytes", MaxTopicNameBytes)
		}
		if c.Topic != nil {
			ps.Add("TopicPrefix", p, "must be empty when Topic is set; Topic decides the whole Kafka topic")
		}
	}
	if c.PublishTimeout < minPublishTimeout || c.PublishTimeout > maxPublishTimeout {
		ps.Add("PublishTimeout", c.PublishTimeout, "must be between %s and %s", minPublishTimeout, maxPublishTimeout)
	}
	return ps.Err()
}

// SubscriberConfig configures a Subscriber. The zero value of every field
// means its default; WithDefaults fills them in and Validate checks the
// result.
type SubscriberConfig struct {
	// MaxInFlight bounds the records being processed at once, across
	// partitions. Each partition processes one record at a time, so the
	// parallelism is the lesser of MaxInFlight and the partitions this
	// member is assigned. Default 16, or, when Run's Processor asks for
	// more (a postbox.InFlightHinter, as Inbox.BatchProcessor is), that
	// many, at most 4096.
	MaxInFlight int

	// PartitionBuffer is how many fetched records a partition may hold
	// waiting for its turn; at that many, fetching it pauses until half
	// are processed. Default 256.
	PartitionBuffer int

	// CommitInterval is the least time between two offset commits: the
	// offsets settled meanwhile go in one commit. A crash loses at most
	// this much of commit progress, whose records are delivered again and
	// absorbed by the inbox. Default 100ms.
	CommitInterval time.Duration

	// CommitTimeout bounds one offset commit, the one made when
	// partitions are revoked and the last one when Run ends included.
	// Default 10s.
	CommitTimeout time.Duration

	// MaxRetryHold caps how long a partition is held for a Retry verdict:
	// a longer Delay is shortened to it. Default 5m.
	MaxRetryHold time.Duration

	// Logger receives fetch, commit and group errors. Default
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *SubscriberConfig) WithDefaults() *SubscriberConfig {
	var out SubscriberConfig
	if c != nil {
		out = *c
	}
	configcheck.Default(&out.MaxInFlight, DefaultMaxInFlight)
	configcheck.Default(&out.PartitionBuffer, DefaultPartitionBuffer)
	configcheck.Default(&out.CommitInterval, DefaultCommitInterval)
	configcheck.Default(&out.CommitTimeout, DefaultCommitTimeout)
	configcheck.Default(&out.MaxRetryHold, DefaultMaxRetryHold)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a SubscriberConfig that WithDefaults has filled in. It
// returns a *postbox.ConfigError listing every bad field, or nil.
func (c *SubscriberConfig) Validate() error {
	var ps problems
	if c.MaxInFlight < 1 || c.MaxInFlight > maxMaxInFlight {
		ps.Add("MaxInFlight", c.MaxInFlight, "must be between 1 and %d", maxMaxInFlight)
	}
	if c.PartitionBuffer < 1 || c.PartitionBuffer > maxPartitionBuffer {
		ps.Add("PartitionBuffer", c.PartitionBuffer, "must be between 1 and %d", maxPartitionBuffer)
	}
	if c.CommitInterval < time.Millisecond || c.CommitInterval > maxCommitInterval {
		ps.Add("CommitInterval", c.CommitInterval, "must be between 1ms and %s", maxCommitInterval)
	}
	if c.CommitTimeout < 100*time.Millisecond || c.CommitTimeout > 5*time.Minute {
		ps.Add("CommitTimeout", c.CommitTimeout, "must be between 100ms and 5m")
	}
	if c.MaxRetryHold < time.Millisecond || c.MaxRetryHold > maxRetryHold {
		ps.Add("MaxRetryHold", c.MaxRetryHold, "must be between 1ms and %s", maxRetryHold)
	}
	return ps.Err()
}

// problems collects the bad fields of one config.
type problems = configcheck.Problems

// ValidateTopicName reports whether name is a topic name Kafka accepts
// for postbox messages: 1 to 249 bytes of ASCII letters, digits, '.', '_'
// and '-', not "." or "..", and not starting with "__", the prefix of
// Kafka's internal topics (__consumer_offsets, __transaction_state).
// The error wraps ErrInvalidTopic.
func ValidateTopicName(name string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidTopic, configcheck.Shorten(name), fmt.Sprintf(format, args...))
	}
	switch {
	case name == "":
		return bad("it is empty")
	case len(name) > MaxTopicNameBytes:
		return bad("it is %d bytes, over Kafka's limit of %d", len(name), MaxTopicNameBytes)
	case name == "." || name == "..":
		return bad("Kafka does not allow %q as a topic name", name)
	case strings.HasPrefix(name, "__"):
		return bad(`names starting with "__" are Kafka's internal topics`)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !topicByte(c) {
			_, size := utf8.DecodeRuneInString(name[i:])
			return bad("it has %q at byte %d; Kafka allows only ASCII letters, digits and . _ -", name[i:i+size], i)
		}
	}
	return nil
}

func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// validateGroup checks a consumer group id: 1 to 255 bytes of printable
// UTF-8.
func validateGroup(g string) error {
	switch {
	case g == "":
		return fmt.Errorf("must not be empty")
	case len(g) > maxGroupBytes:
		return fmt.Errorf("is %d bytes, over the limit of %d", len(g), maxGroupBytes)
	case !printable.Line(g):
		return fmt.Errorf("must be printable UTF-8 text")
	}
	return nil
}
