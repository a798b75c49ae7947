package postboxnats

import (
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// Defaults, as documented on Config.
const (
	// DefaultPublishTimeout leaves half of the relay's default batch
	// deadline (10s) for the rest of the batch: a message that times out
	// still comes back as an infrastructure failure inside the batch, not
	// as an abandoned publish at its deadline.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultMaxPending is four times the relay's default publish window.
	// The relay's window is the limit that matters in normal operation;
	// the headroom is for publishes the relay has given up on (its batch
	// deadline passed) whose acks are still on their way, and which keep
	// holding a slot until they resolve.
	DefaultMaxPending = 1024
)

// Bounds checked by Validate.
const (
	minPublishTimeout = 10 * time.Millisecond
	maxPublishTimeout = 10 * time.Minute
	maxMaxPending     = 1 << 20
	maxStreamName     = 255
)

// Config configures a Publisher. The zero value of every field means its
// default; WithDefaults fills them in and Validate checks the result,
// naming every bad field at once.
type Config struct {
	// SubjectPrefix is prepended to the topic to make the subject:
	// "events." publishes topic "orders.created" on
	// "events.orders.created". It must be empty or end with ".", so that a
	// topic always starts a token of its own. Default "" (the subject is
	// the topic).
	SubjectPrefix string

	// Subject, when set, maps a topic to its subject instead of
	// SubjectPrefix. It must be a pure function of the topic: it is called
	// on the relay's goroutine for every message, and a message's subject
	// must not change between its retries. Its result is checked on every
	// publish; a result that is not a valid subject fails that message
	// (a message failure), not the relay.
	Subject func(topic string) string

	// ExpectStream, when set, is sent as Nats-Expected-Stream: the server
	// rejects the message unless that stream stores it. It guards against
	// a subject captured by the wrong stream after a topology change.
	ExpectStream string

	// PublishTimeout bounds the wait for one message's PubAck. A message
	// without an ack by then fails as an infrastructure failure (it may
	// have been stored; its retry carries the same Nats-Msg-Id and is
	// absorbed as a duplicate). Keep it under the relay's BatchDeadline.
	// Default 5s.
	PublishTimeout time.Duration

	// MaxPending is the most publishes awaiting a PubAck at once; Publish
	// blocks (until its context ends) while the window is full. Default
	// 1024.
	MaxPending int
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.PublishTimeout == 0 {
		out.PublishTimeout = DefaultPublishTimeout
	}
	if out.MaxPending == 0 {
		out.MaxPending = DefaultMaxPending
	}
	return &out
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *postbox.ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	var ps []*postbox.ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, configcheck.Problem(field, value, format, args...))
	}
	if p := c.SubjectPrefix; p != "" {
		switch {
		case !strings.HasSuffix(p, "."):
			bad("SubjectPrefix", p, `must end with "." so that the topic starts a token of its own`)
		case validateSubject(p+"x") != nil:
			bad("SubjectPrefix", p, "is not a valid subject prefix: %v", validateSubject(p+"x"))
		}
		if c.Subject != nil {
			bad("SubjectPrefix", p, "must be empty when Subject is set; Subject decides the whole subject")
		}
	}
	if s := c.ExpectStream; s != "" {
		if len(s) > maxStreamName || strings.ContainsAny(s, ">*. /\\\t\r\n") || !printable.Line(s) {
			bad("ExpectStream", s, "is not a valid stream name (printable, at most %d bytes, none of . * > / \\ or whitespace)", maxStreamName)
		}
	}
	if c.PublishTimeout < minPublishTimeout || c.PublishTimeout > maxPublishTimeout {
		bad("PublishTimeout", c.PublishTimeout, "must be between %s and %s", minPublishTimeout, maxPublishTimeout)
	}
	if c.MaxPending < 1 || c.MaxPending > maxMaxPending {
		bad("MaxPending", c.MaxPending, "must be between 1 and %d", maxMaxPending)
	}
	if len(ps) > 0 {
		return &postbox.ConfigError{Problems: ps}
	}
	return nil
}
