package postbox

import (
	"context"
	"time"
)

// Publisher sends envelopes to a broker. It is the seam every broker adapter
// implements (postboxnats, and the in-memory one in postboxtest).
//
// Publish starts sending env and returns; done is called exactly once, from
// any goroutine, with nil once the broker has acknowledged the message
// (a JetStream PubAck, a publisher confirm), or with the error that stopped
// it. Wrap failures caused by the message itself with NewMessageError; any
// other error counts as an infrastructure failure. Publish may block while
// the adapter's own window is full, but must give up when ctx ends, calling
// done with the context's error.
//
// The relay calls Publish from several goroutines at once (one per lane),
// never has more than Config.PublishWindow publishes outstanding, and never
// publishes a keyed message before the previous message of its key was
// acknowledged.
type Publisher interface {
	Publish(ctx context.Context, env *Envelope, done func(error))
}

// Envelope is a message as the relay hands it to a Publisher.
type Envelope struct {
	ID      string
	Topic   string
	Key     string
	Payload []byte
	// Headers holds the message's headers and its CloudEvents attributes
	// in binary mode: ce-specversion, ce-id, ce-type, ce-source, ce-time,
	// and ce-subject, ce-partitionkey, content-type where set.
	Headers   map[string]string
	CreatedAt time.Time
	// Attempt counts publishes of this message, this one included.
	Attempt int
}

// PublisherFunc adapts a blocking function to Publisher: each lane then has
// one publish at a time outstanding. Convenient for tests and in-process
// handlers, too slow for a broker.
type PublisherFunc func(ctx context.Context, env *Envelope) error

// Publish implements Publisher.
func (f PublisherFunc) Publish(ctx context.Context, env *Envelope, done func(error)) {
	done(f(ctx, env))
}

// MessageChecker is implemented by publishers that can tell, before a
// message is written, that they could never deliver it: a topic their
// broker cannot name, a header or key their protocol cannot carry, a
// payload above their maximum. A Client calls it for each message with the
// publisher of the message's route, handing it the envelope the relay
// would hand Publish (the id the row gets, the headers with their
// CloudEvents attributes, Attempt 1), and refuses the write with a
// *ValidationError, instead of letting the message fail at publish (G9).
// CheckMessage must not keep env or change it.
type MessageChecker interface {
	CheckMessage(env *Envelope) error
}
