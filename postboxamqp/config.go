package postboxamqp

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// Publisher defaults, as documented on Config.
const (
	// DefaultExchange is the exchange a Publisher sends to when
	// Config.Exchange is empty.
	DefaultExchange = "postbox"
	// DefaultPublishTimeout leaves half of the relay's default batch
	// deadline (10s) for the rest of the batch.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultMaxPending is four times the relay's default publish window:
	// headroom for publishes the relay has given up on whose confirms are
	// still on their way, each holding a slot until it resolves.
	DefaultMaxPending = 1024
	// DefaultMaxMessageSize is RabbitMQ 4's default max_message_size
	// (16 MiB); RabbitMQ 3.x defaults to 128 MiB.
	DefaultMaxMessageSize = 16 << 20
	// DefaultDialTimeout bounds one connection attempt, handshake included.
	DefaultDialTimeout = 10 * time.Second
	// DefaultReconnectBackoff and DefaultReconnectBackoffMax bound the
	// pause between failed connection attempts (doubling, equal jitter).
	DefaultReconnectBackoff    = 100 * time.Millisecond
	DefaultReconnectBackoffMax = 5 * time.Second
)

// Subscriber defaults, as documented on SubscriberConfig.
const (
	DefaultPrefetch    = 64
	DefaultMaxInFlight = 16
	// DefaultMaxRetryHold equals the inbox's default BackoffMax, so every
	// redelivery delay the inbox asks for at its defaults is honoured.
	DefaultMaxRetryHold = 5 * time.Minute
)

// Bounds checked by Validate.
const (
	minPublishTimeout = 10 * time.Millisecond
	maxPublishTimeout = 10 * time.Minute
	maxMaxPending     = 1 << 16
	maxMessageSize    = 512 << 20 // RabbitMQ's own ceiling for max_message_size
	maxShortString    = 255       // AMQP 0-9-1 shortstr: names, routing keys, message-id
	maxPrefetch       = 65535     // basic.qos prefetch-count is a short
	// maxRetryHold stays well under RabbitMQ's default consumer_timeout
	// (30 minutes): a delivery held longer would make the broker close the
	// channel.
	maxRetryHold = 25 * time.Minute
)

// Config configures a Publisher. The zero value of every field means its
// default; WithDefaults fills them in and Validate checks the result,
// naming every bad field at once.
type Config struct {
	// Exchange receives every message. It must exist: make it with
	// EnsureTopology or by the operator; publishing declares nothing.
	// Default "postbox".
	Exchange string

	// RoutingKey maps a topic to the routing key. It must be a pure
	// function of the topic (it runs for every message, and a message's
	// key must not change between its retries). A result that is not a
	// valid routing key (over 255 bytes, not UTF-8) fails that message.
	// Default: the topic itself.
	RoutingKey func(topic string) string

	// DisableMandatory publishes without the mandatory flag. Leave it off:
	// without it, RabbitMQ confirms a message that no queue received and
	// the message is lost while marked published (docs/design.md §8). To accept
	// unroutable messages for some topics, use AcceptUnroutable instead,
	// which still sees and counts them.
	DisableMandatory bool

	// AcceptUnroutable lists the topics whose unroutable messages count as
	// published: fan-out topics where "no queue bound yet" is normal. An
	// entry is a topic, or a prefix ending in "*" ("audit.*" matches every
	// topic that starts with "audit."; "*" matches all). Such messages are
	// counted by Unroutable. Every other unroutable message is a message
	// failure. Default none.
	AcceptUnroutable []string

	// OnUnroutable, when set, is called with the topic of every message
	// that AcceptUnroutable let count as published: a hook for a metric
	// (a counter by topic) without a metrics dependency here. It runs on
	// the Publisher's reader goroutine and must be quick.
	OnUnroutable func(topic string)

	// PublishTimeout bounds the wait for one message's confirm. A message
	// without one by then fails as an infrastructure failure (it may have
	// been enqueued; its retry carries the same message-id and the
	// consumers' inbox absorbs the copy). Keep it under the relay's
	// BatchDeadline. Default 5s.
	PublishTimeout time.Duration

	// MaxPending is the most publishes awaiting a confirm at once; Publish
	// blocks (until its context ends) while the window is full. Default
	// 1024.
	MaxPending int

	// MaxMessageSize is the largest payload sent; a larger one fails as a
	// message failure before it reaches the broker. Set it to the server's
	// max_message_size. Default 16 MiB.
	MaxMessageSize int

	// DialTimeout bounds one connection attempt. Default 10s.
	DialTimeout time.Duration

	// ReconnectBackoff and ReconnectBackoffMax bound the pause after a
	// failed connection attempt, doubling with equal jitter. Defaults
	// 100ms and 5s.
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration

	// Logger receives connection losses and reconnects. Default
	// slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Exchange == "" {
		out.Exchange = DefaultExchange
	}
	configcheck.Default(&out.PublishTimeout, DefaultPublishTimeout)
	configcheck.Default(&out.MaxPending, DefaultMaxPending)
	configcheck.Default(&out.MaxMessageSize, DefaultMaxMessageSize)
	configcheck.Default(&out.DialTimeout, DefaultDialTimeout)
	configcheck.Default(&out.ReconnectBackoff, DefaultReconnectBackoff)
	configcheck.Default(&out.ReconnectBackoffMax, DefaultReconnectBackoffMax)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *postbox.ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	var ps problems
	if err := validateName(c.Exchange); err != nil {
		ps.Add("Exchange", c.Exchange, "%v", err)
	}
	for i, pat := range c.AcceptUnroutable {
		if err := validatePattern(pat); err != nil {
			ps.Add(fmt.Sprintf("AcceptUnroutable[%d]", i), pat, "%v", err)
		}
	}
	if c.DisableMandatory && len(c.AcceptUnroutable) > 0 {
		ps.Add("AcceptUnroutable", strings.Join(c.AcceptUnroutable, ","), "has no effect with DisableMandatory: without the mandatory flag the broker never reports an unroutable message")
	}
	if c.PublishTimeout < minPublishTimeout || c.PublishTimeout > maxPublishTimeout {
		ps.Add("PublishTimeout", c.PublishTimeout, "must be between %s and %s", minPublishTimeout, maxPublishTimeout)
	}
	if c.MaxPending < 1 || c.MaxPending > maxMaxPending {
		ps.Add("MaxPending", c.MaxPending, "must be between 1 and %d", maxMaxPending)
	}
	if c.MaxMessageSize < 1 || c.MaxMessageSize > maxMessageSize {
		ps.Add("MaxMessageSize", c.MaxMessageSize, "must be between 1 and %d (RabbitMQ's ceiling)", maxMessageSize)
	}
	checkBackoff(&ps, "DialTimeout", c.DialTimeout, "ReconnectBackoff", c.ReconnectBackoff, "ReconnectBackoffMax", c.ReconnectBackoffMax)
	return ps.Err()
}

// SubscriberConfig configures a Subscriber. The zero value of every field
// means its default; WithDefaults fills them in and Validate checks the
// result.
type SubscriberConfig struct {
	// Prefetch is the basic.qos prefetch count: the most deliveries the
	// broker hands this subscriber before they are settled, held retries
	// included. At least MaxInFlight. Default 64, or MaxInFlight when
	// that is larger; a Run whose window a Processor's hint raised (see
	// MaxInFlight) keeps the defaults' 48 places above it.
	Prefetch int

	// MaxInFlight bounds deliveries being processed at once. Default 16
	// (or Prefetch, when that is set lower), or, when Run's Processor
	// asks for more (a postbox.InFlightHinter, as Inbox.BatchProcessor
	// is), that many, at most Prefetch when Prefetch is set.
	MaxInFlight int

	// PerKey processes the deliveries of one key (the ce-partitionkey
	// header) one at a time, in the order this subscriber received them.
	// It does not promise per-key order: see the package documentation.
	PerKey bool

	// MaxRetryHold caps how long a delivery is held before it is requeued
	// for a Retry verdict: a longer Delay is shortened to it. Held
	// deliveries count against Prefetch. At most 25 minutes, under
	// RabbitMQ's default consumer_timeout. Default 5m.
	MaxRetryHold time.Duration

	// DialTimeout, ReconnectBackoff and ReconnectBackoffMax are as on
	// Config: they bound connection attempts and the pause between them.
	DialTimeout         time.Duration
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration

	// Logger receives connection losses and settle failures. Default
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
	if out.MaxInFlight == 0 && out.Prefetch > 0 {
		out.MaxInFlight = min(DefaultMaxInFlight, out.Prefetch)
	}
	configcheck.Default(&out.MaxInFlight, DefaultMaxInFlight)
	if out.Prefetch == 0 {
		out.Prefetch = max(DefaultPrefetch, out.MaxInFlight)
	}
	configcheck.Default(&out.MaxRetryHold, DefaultMaxRetryHold)
	configcheck.Default(&out.DialTimeout, DefaultDialTimeout)
	configcheck.Default(&out.ReconnectBackoff, DefaultReconnectBackoff)
	configcheck.Default(&out.ReconnectBackoffMax, DefaultReconnectBackoffMax)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a SubscriberConfig that WithDefaults has filled in. It
// returns a *postbox.ConfigError listing every bad field, or nil.
func (c *SubscriberConfig) Validate() error {
	var ps problems
	if c.MaxInFlight < 1 || c.MaxInFlight > maxPrefetch {
		ps.Add("MaxInFlight", c.MaxInFlight, "must be between 1 and %d", maxPrefetch)
	}
	if c.Prefetch < 1 || c.Prefetch > maxPrefetch {
		ps.Add("Prefetch", c.Prefetch, "must be between 1 and %d", maxPrefetch)
	} else if c.Prefetch < c.MaxInFlight {
		ps.Add("Prefetch", c.Prefetch, "must be at least MaxInFlight (%d), or workers wait for deliveries the broker holds back", c.MaxInFlight)
	}
	if c.MaxRetryHold < time.Millisecond || c.MaxRetryHold > maxRetryHold {
		ps.Add("MaxRetryHold", c.MaxRetryHold, "must be between 1ms and %s (RabbitMQ closes a channel holding a delivery past its consumer_timeout, 30m by default)", maxRetryHold)
	}
	checkBackoff(&ps, "DialTimeout", c.DialTimeout, "ReconnectBackoff", c.ReconnectBackoff, "ReconnectBackoffMax", c.ReconnectBackoffMax)
	return ps.Err()
}

// problems collects the bad fields of one config.
type problems = configcheck.Problems

func checkBackoff(ps *problems, dialName string, dial time.Duration, baseName string, base time.Duration, maxName string, maxDelay time.Duration) {
	if dial < 100*time.Millisecond || dial > 5*time.Minute {
		ps.Add(dialName, dial, "must be between 100ms and 5m")
	}
	if base < time.Millisecond || base > time.Minute {
		ps.Add(baseName, base, "must be between 1ms and 1m")
	}
	if maxDelay < base || maxDelay > 10*time.Minute {
		ps.Add(maxName, maxDelay, "must be between %s (%s) and 10m", baseName, base)
	}
}

// validateName checks an exchange or queue name: 1 to 255 bytes of
// printable UTF-8.
func validateName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("must not be empty")
	case len(s) > maxShortString:
		return fmt.Errorf("is %d bytes, over AMQP's limit of %d", len(s), maxShortString)
	case !printable.Line(s):
		return fmt.Errorf("must be printable UTF-8 text")
	}
	return nil
}

func validatePattern(p string) error {
	if p == "" {
		return fmt.Errorf("must not be empty")
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
		return fmt.Errorf(`may hold "*" only as its last character`)
	}
	if !printable.Line(p) {
		return fmt.Errorf("must be printable UTF-8 text")
	}
	return nil
}

// matchAny reports whether topic matches one of the AcceptUnroutable
// patterns.
func matchAny(patterns []string, topic string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(topic, prefix) {
				return true
			}
		} else if p == topic {
			return true
		}
	}
	return false
}
