package postboxredis

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox/internal/configcheck"
)

// Publisher defaults, as documented on Config.
const (
	// DefaultPublishTimeout leaves half of the relay's default batch
	// deadline (10s) for the rest of the batch.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultMaxPending is four times the relay's default publish window:
	// the headroom is for publishes the relay gave up on whose replies
	// are still on their way, and which hold a slot until they resolve.
	DefaultMaxPending = 1024
	// DefaultPipelines is the number of pipelines in flight at once.
	DefaultPipelines = 4
	// DefaultMaxBatch caps the entries sent in one pipeline.
	DefaultMaxBatch = 128
	// DefaultDedupeWindow is how long a message id is remembered after
	// its entry was added: JetStream's default duplicate window.
	DefaultDedupeWindow = 2 * time.Minute
	// DefaultMaxEntryBytes caps an entry's fields. Redis keeps every entry
	// in memory; large payloads are a poor fit for a stream.
	DefaultMaxEntryBytes = 16 << 20
	// DefaultReplicaTimeout bounds the WAIT for MinReplicas.
	DefaultReplicaTimeout = time.Second
)

// Subscriber defaults, as documented on SubscriberConfig.
const (
	DefaultMaxInFlight     = 64
	DefaultBlock           = time.Second
	DefaultMinIdle         = 30 * time.Second
	DefaultClaimInterval   = 5 * time.Second
	DefaultIdleConsumerTTL = time.Hour
)

// Bounds checked by Validate.
const (
	// MaxStreamNameBytes caps a stream or group name.
	MaxStreamNameBytes = 1024
	// MaxIDBytes caps a message id; postbox makes UUIDs.
	MaxIDBytes = 255

	minPublishTimeout = 10 * time.Millisecond
	maxPublishTimeout = 10 * time.Minute
	maxMaxPending     = 1 << 20
	maxPipelines      = 64
	maxMaxBatch       = 10_000
	minDedupeWindow   = time.Second
	maxDedupeWindow   = 7 * 24 * time.Hour
	minMaxEntryBytes  = 1 << 10
	maxMaxEntryBytes  = 512 << 20
	maxMinReplicas    = 100
	maxMaxInFlight    = 4096
	minBlock          = 10 * time.Millisecond
	maxBlock          = time.Minute
	minMinIdle        = 100 * time.Millisecond
	minClaimInterval  = 10 * time.Millisecond
)

// Config configures a Publisher. The zero value of every field means its
// default; WithDefaults fills them in and Validate checks the result,
// naming every bad field at once.
type Config struct {
	// StreamPrefix is prepended to the topic to name its stream: one
	// stream per topic. "events:" publishes topic "orders.created" to the
	// stream "events:orders.created". Default "" (the stream is the
	// topic).
	StreamPrefix string

	// Stream, when set, is the one stream every topic is published to;
	// StreamPrefix must then be empty. Each entry carries its topic in
	// the topic field either way.
	Stream string

	// MaxLen, when positive, trims the stream to about this many entries
	// on every add (XADD MAXLEN ~). This trades durability for memory:
	// a trimmed entry is gone for every consumer group, also for one
	// that had not read it yet, or had read it and not yet acknowledged
	// it. Size it well above the largest backlog a group may fall behind
	// by. Default 0: never trim.
	MaxLen int64

	// TrimExact trims to exactly MaxLen (MAXLEN =) instead of about it,
	// at a cost on every add. Default false.
	TrimExact bool

	// DedupeWindow is how long the Publisher remembers a message id after
	// its entry was added: a publish of the same id to the same stream
	// within the window adds nothing and reports success. Redis has no
	// deduplication of its own; the guard is a key per message that
	// expires after the window, checked and set by the same script that
	// adds the entry. Default 2m.
	DedupeWindow time.Duration

	// DisableDedupe turns the guard off: no key per message, and a retry
	// after a lost reply adds the entry again (the consumers' inbox still
	// absorbs the copy). DedupeWindow must then be zero.
	DisableDedupe bool

	// PublishTimeout bounds the wait for Redis's reply to one publish. A
	// message without a reply by then fails as an infrastructure failure
	// wrapping ErrPublishTimeout. Keep it under the relay's
	// BatchDeadline. Default 5s.
	PublishTimeout time.Duration

	// MaxPending is the most publishes awaiting their reply at once;
	// Publish blocks (until its context ends) while the window is full.
	// Default 1024.
	MaxPending int

	// Pipelines is the number of pipelines in flight at once. Each
	// carries the publishes that queued up while the previous ones were
	// out, up to MaxBatch. Default 4.
	Pipelines int

	// MaxBatch caps the publishes sent in one pipeline. Default 128.
	MaxBatch int

	// MaxEntryBytes caps the bytes of an entry's fields (id, topic, key,
	// payload, headers). A larger message fails as a message failure
	// wrapping ErrTooLarge, before anything is sent. Keep it at or under
	// the server's proto-max-bulk-len (512 MiB by default): the server
	// answers a larger argument by closing the connection, which would
	// fail every publish sharing it. Default 16 MiB.
	MaxEntryBytes int

	// MinReplicas, when positive, makes every pipeline end with WAIT
	// MinReplicas ReplicaTimeout: its publishes succeed only once that
	// many replicas confirmed them, and otherwise fail as infrastructure
	// failures wrapping ErrNotReplicated. Not supported on a Redis
	// Cluster client (WAIT has no key to route by). Default 0.
	MinReplicas int

	// ReplicaTimeout bounds WAIT; it must be under PublishTimeout and
	// under the client's ReadTimeout. Default 1s; only set with
	// MinReplicas.
	ReplicaTimeout time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.DedupeWindow == 0 && !out.DisableDedupe {
		out.DedupeWindow = DefaultDedupeWindow
	}
	configcheck.Default(&out.PublishTimeout, DefaultPublishTimeout)
	configcheck.Default(&out.MaxPending, DefaultMaxPending)
	configcheck.Default(&out.Pipelines, DefaultPipelines)
	configcheck.Default(&out.MaxBatch, DefaultMaxBatch)
	configcheck.Default(&out.MaxEntryBytes, DefaultMaxEntryBytes)
	if out.MinReplicas > 0 {
		configcheck.Default(&out.ReplicaTimeout, DefaultReplicaTimeout)
	}
	return &out
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *postbox.ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	var ps problems
	if c.Stream != "" {
		if err := ValidateStreamName(c.Stream); err != nil {
			ps.Add("Stream", c.Stream, "%v", err)
		}
		if c.StreamPrefix != "" {
			ps.Add("StreamPrefix", c.StreamPrefix, "must be empty when Stream is set; Stream names the one stream")
		}
	} else if c.StreamPrefix != "" {
		if err := ValidateStreamName(c.StreamPrefix + "x"); err != nil {
			ps.Add("StreamPrefix", c.StreamPrefix, "is not a valid stream name prefix: %v", err)
		}
	}
	if c.MaxLen < 0 {
		ps.Add("MaxLen", c.MaxLen, "must not be negative (0 never trims)")
	}
	if c.TrimExact && c.MaxLen == 0 {
		ps.Add("TrimExact", c.TrimExact, "has no effect without MaxLen")
	}
	if c.DisableDedupe {
		if c.DedupeWindow != 0 {
			ps.Add("DedupeWindow", c.DedupeWindow, "must be zero when DisableDedupe is set")
		}
	} else if c.DedupeWindow < minDedupeWindow || c.DedupeWindow > maxDedupeWindow {
		ps.Add("DedupeWindow", c.DedupeWindow, "must be between %s and %s", minDedupeWindow, maxDedupeWindow)
	}
	if c.PublishTimeout < minPublishTimeout || c.PublishTimeout > maxPublishTimeout {
		ps.Add("PublishTimeout", c.PublishTimeout, "must be between %s and %s", minPublishTimeout, maxPublishTimeout)
	}
	if c.MaxPending < 1 || c.MaxPending > maxMaxPending {
		ps.Add("MaxPending", c.MaxPending, "must be between 1 and %d", maxMaxPending)
	}
	if c.Pipelines < 1 || c.Pipelines > maxPipelines {
		ps.Add("Pipelines", c.Pipelines, "must be between 1 and %d", maxPipelines)
	}
	if c.MaxBatch < 1 || c.MaxBatch > maxMaxBatch {
		ps.Add("MaxBatch", c.MaxBatch, "must be between 1 and %d", maxMaxBatch)
	}
	if c.MaxEntryBytes < minMaxEntryBytes || c.MaxEntryBytes > maxMaxEntryBytes {
		ps.Add("MaxEntryBytes", c.MaxEntryBytes, "must be between %d and %d", minMaxEntryBytes, maxMaxEntryBytes)
	}
	if c.MinReplicas < 0 || c.MinReplicas > maxMinReplicas {
		ps.Add("MinReplicas", c.MinReplicas, "must be between 0 and %d", maxMinReplicas)
	}
	switch {
	case c.MinReplicas <= 0 && c.ReplicaTimeout != 0:
		ps.Add("ReplicaTimeout", c.ReplicaTimeout, "has no effect without MinReplicas")
	case c.MinReplicas > 0 && (c.ReplicaTimeout < time.Millisecond || c.ReplicaTimeout >= c.PublishTimeout):
		ps.Add("ReplicaTimeout", c.ReplicaTimeout, "must be at least 1ms and under PublishTimeout (%s)", c.PublishTimeout)
	}
	return ps.Err()
}

// SubscriberConfig configures a Subscriber. The zero value of every field
// but Stream and Group means its default; WithDefaults fills them in and
// Validate checks the result, naming every bad field at once.
type SubscriberConfig struct {
	// Stream is the stream to consume. Required.
	Stream string

	// Group is the consumer group, made with EnsureGroup. Required.
	// Subscribers of one group share its entries; every group gets every
	// entry.
	Group string

	// Consumer names this subscriber within the group. Default: a name of
	// its own for every Run (host, process id and a random suffix), which
	// Run deletes when it ends with nothing pending. A stable name is
	// only needed to inspect one subscriber with XINFO; two Runs at once
	// must not share one.
	Consumer string

	// MaxInFlight bounds the entries a Run holds at once: being
	// processed, waiting for a Retry's delay, and, with PerKey, waiting
	// for an earlier entry of their key. Each XREADGROUP asks for at most
	// the free places. Default 64, or, when Run's Processor asks for more
	// (a postbox.InFlightHinter, as Inbox.BatchProcessor is), that many,
	// at most 4096.
	MaxInFlight int

	// Block is how long one XREADGROUP waits for new entries. Run returns
	// at most this long after its context ends. Default 1s.
	Block time.Duration

	// MinIdle is how long an entry must have been pending, with no sign
	// of life from its consumer, before another subscriber of the group
	// claims it (XAUTOCLAIM): the time a dead subscriber's entries wait.
	// A live Run keeps the entries it holds younger than this
	// (XCLAIM JUSTID every MinIdle/3), also while a slow handler runs.
	// Default 30s.
	MinIdle time.Duration

	// ClaimInterval is the pause between a Run's claims of entries idle
	// for MinIdle. Default 5s; at most MinIdle.
	ClaimInterval time.Duration

	// IdleConsumerTTL: every Run deletes, now and then, the group's
	// consumers that have nothing pending and have not been seen for this
	// long (subscribers that died, once their entries were claimed).
	// Default 1h; at least twice MinIdle and Block.
	IdleConsumerTTL time.Duration

	// PerKey processes the entries of one key one at a time, in stream
	// order, a retry included: a later entry of a key waits while an
	// earlier one is processed or waits for its Retry's delay. Entries
	// without a key stay fully parallel. The order holds within one Run;
	// see the package documentation for what it takes across subscribers.
	PerKey bool

	// Logger; default slog.Default().
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
	configcheck.Default(&out.Block, DefaultBlock)
	configcheck.Default(&out.MinIdle, DefaultMinIdle)
	if out.ClaimInterval == 0 {
		out.ClaimInterval = min(DefaultClaimInterval, out.MinIdle)
	}
	configcheck.Default(&out.IdleConsumerTTL, DefaultIdleConsumerTTL)
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// Validate checks a SubscriberConfig that WithDefaults has filled in. It
// returns a *postbox.ConfigError listing every bad field, or nil.
func (c *SubscriberConfig) Validate() error {
	var ps problems
	if err := ValidateStreamName(c.Stream); err != nil {
		ps.Add("Stream", c.Stream, "%v", err)
	}
	if err := validateName(c.Group); err != nil {
		ps.Add("Group", c.Group, "%v", err)
	}
	if c.Consumer != "" {
		if err := validateName(c.Consumer); err != nil {
			ps.Add("Consumer", c.Consumer, "%v", err)
		}
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > maxMaxInFlight {
		ps.Add("MaxInFlight", c.MaxInFlight, "must be between 1 and %d", maxMaxInFlight)
	}
	if c.Block < minBlock || c.Block > maxBlock {
		ps.Add("Block", c.Block, "must be between %s and %s", minBlock, maxBlock)
	}
	if c.MinIdle < minMinIdle {
		ps.Add("MinIdle", c.MinIdle, "must be at least %s", minMinIdle)
	}
	if c.ClaimInterval < minClaimInterval || c.ClaimInterval > c.MinIdle {
		ps.Add("ClaimInterval", c.ClaimInterval, "must be at least %s and at most MinIdle (%s)", minClaimInterval, c.MinIdle)
	}
	if c.IdleConsumerTTL < 2*c.MinIdle || c.IdleConsumerTTL < 2*c.Block {
		ps.Add("IdleConsumerTTL", c.IdleConsumerTTL, "must be at least twice MinIdle (%s) and twice Block (%s)", c.MinIdle, c.Block)
	}
	return ps.Err()
}

// problems collects the bad fields of one config.
type problems = configcheck.Problems

// ValidateStreamName reports whether name can name a stream here: 1 to
// MaxStreamNameBytes bytes of UTF-8 without whitespace or control
// characters; and a name with a '}' must hold a Redis Cluster hash tag
// (a '{', then something, then the first '}' after it), so that the
// Publisher's dedupe keys can share the stream's slot. The error wraps
// ErrInvalidStream.
func ValidateStreamName(name string) error {
	if err := validateName(name); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidStream, configcheck.Shorten(name), err)
	}
	if strings.Contains(name, "}") && hashTag(name) == "" {
		return fmt.Errorf("%w %q: it has a '}' but no hash tag; write {tag} with something inside, or no braces", ErrInvalidStream, configcheck.Shorten(name))
	}
	return nil
}

// validateName checks a stream, group or consumer name.
func validateName(name string) error {
	switch {
	case name == "":
		return errorString("it is empty")
	case len(name) > MaxStreamNameBytes:
		return fmt.Errorf("it is %d bytes, over the limit of %d", len(name), MaxStreamNameBytes)
	case !utf8.ValidString(name):
		return errorString("it is not valid UTF-8")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("it has %q at byte %d; whitespace and control characters are not allowed", c, i)
		}
	}
	return nil
}

type errorString string

func (e errorString) Error() string { return string(e) }

// hashTag returns the part of key Redis Cluster hashes when it is not the
// whole key: what lies between the first '{' and the first '}' after it,
// if that is not empty.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return key[open+1 : open+1+end]
}

// sameSlot returns key names that begin with a name that hashes to
// stream's slot: stream itself when it holds a hash tag, else stream in
// braces.
func sameSlot(stream string) string {
	if hashTag(stream) != "" {
		return stream
	}
	return "{" + stream + "}"
}
