package postboxamqp

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors this package reports as the cause of a message failure. The
// Publisher wraps them with postbox.NewMessageError where they arise, so
// that postbox.IsMessageError tells them apart; errors.Is finds them
// through that wrapper.
var (
	// ErrUnroutable means the broker returned the message (basic.return,
	// 312 NO_ROUTE): no queue is bound for its routing key, so it was
	// stored nowhere.
	ErrUnroutable = errors.New("postboxamqp: message unroutable (no queue bound for its routing key)")
	// ErrTooLarge means the payload is over Config.MaxMessageSize, or the
	// properties and headers do not fit the connection's frame_max.
	ErrTooLarge = errors.New("postboxamqp: message too large")
	// ErrInvalidRoutingKey means the topic mapped to a routing key AMQP
	// cannot carry (over 255 bytes, not UTF-8).
	ErrInvalidRoutingKey = errors.New("postboxamqp: invalid routing key")
	// ErrInvalidHeader means a header cannot travel as an AMQP header, or
	// is one that steers RabbitMQ (CC, BCC, x-delay, x-death, ...).
	ErrInvalidHeader = errors.New("postboxamqp: invalid header")
	// ErrNoID means the envelope carries no message id.
	ErrNoID = errors.New("postboxamqp: envelope has no message id")
	// ErrRejected means the broker closed the channel over this message
	// (an exception such as 406 PRECONDITION_FAILED for a message over the
	// server's max_message_size) while it was the only publish in flight,
	// so it alone is to blame.
	ErrRejected = errors.New("postboxamqp: broker rejected the message")
)

// Errors this package reports as infrastructure failures: the relay spends
// no attempt, keeps the message pending and pauses.
var (
	// ErrClosed is the failure of publishes cut off by Close, and of every
	// Publish after it.
	ErrClosed = errors.New("postboxamqp: publisher closed")
	// ErrNotConnected means no connection was available: the last attempt
	// failed and the next one waits for its backoff.
	ErrNotConnected = errors.New("postboxamqp: not connected")
	// ErrConnectionLost means the channel or connection closed while the
	// message awaited its confirm; it may or may not have been enqueued.
	ErrConnectionLost = errors.New("postboxamqp: connection lost before the confirm")
	// ErrNacked means the broker answered with basic.nack: a queue process
	// failed, or a queue with x-overflow=reject-publish is full. Both are
	// states of the broker that pass.
	ErrNacked = errors.New("postboxamqp: broker nacked the message")
	// ErrPublishTimeout means no confirm arrived within PublishTimeout.
	ErrPublishTimeout = errors.New("postboxamqp: no confirm within the publish timeout")
	// ErrBlocked means the broker blocked publishing on the connection (a
	// memory or disk alarm, connection.blocked).
	ErrBlocked = errors.New("postboxamqp: broker blocked publishing")
	// ErrNoExchange means the broker has no such exchange (404 on
	// publish). Every message of the Publisher fails alike until the
	// exchange exists, so it spends no attempts.
	ErrNoExchange = errors.New("postboxamqp: exchange not found")
)

// contentFault reports whether the broker closed the channel or the
// connection over the content of something published on it: a message
// over max_message_size or with a property the broker refuses (406 on a
// channel that only publishes), a header frame over frame_max (501), a
// malformed frame (502, 505). Only exceptions the server raised count:
// the client reports a lost socket as a 501 of its own.
func contentFault(e *amqp.Error) bool {
	if e == nil || !e.Server {
		return false
	}
	switch e.Code {
	case amqp.PreconditionFailed, amqp.FrameError, amqp.SyntaxError, amqp.UnexpectedFrame:
		return true
	}
	return false
}

// lostError is the infrastructure failure of a publish whose channel
// closed under it.
func lostError(id string, cause *amqp.Error) error {
	switch {
	case cause == nil:
		return fmt.Errorf("postboxamqp: publish %s: %w", id, ErrConnectionLost)
	case cause.Server && cause.Code == amqp.NotFound:
		return fmt.Errorf("postboxamqp: publish %s: %w: %w", id, ErrNoExchange, cause)
	}
	return fmt.Errorf("postboxamqp: publish %s: %w: %w", id, ErrConnectionLost, cause)
}
