package postboxkafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/postbox-go/postbox"
)

// Errors this package reports as the cause of a message failure. The
// Publisher wraps them with postbox.NewMessageError; errors.Is finds them
// through that wrapper.
var (
	// ErrNoTopic means the cluster confirmed that the message's Kafka
	// topic does not exist. It is reported only after a metadata lookup of
	// the topic: a produce that merely met an unknown topic may have met
	// one that is being created, or a broker whose metadata lags.
	ErrNoTopic = errors.New("postboxkafka: topic does not exist")
	// ErrInvalidTopic means the topic maps to a name Kafka does not allow
	// (see ValidateTopicName).
	ErrInvalidTopic = errors.New("postboxkafka: invalid topic")
	// ErrInvalidHeader means a header cannot travel as a Kafka header: a
	// name starting with "ce_" that is not a CloudEvents attribute (it
	// would be read back as one), or a value that is not UTF-8.
	ErrInvalidHeader = errors.New("postboxkafka: invalid header")
	// ErrNoID means the envelope carries no message id.
	ErrNoID = errors.New("postboxkafka: envelope has no message id")
)

// Errors this package reports as infrastructure failures: the relay spends
// no attempt, keeps the message pending and pauses.
var (
	// ErrClosed is the failure of every Publish after Close, and of
	// publishes still unacknowledged when Close gave up waiting.
	ErrClosed = errors.New("postboxkafka: publisher closed")
	// ErrPublishTimeout means no acknowledgement arrived within
	// PublishTimeout.
	ErrPublishTimeout = errors.New("postboxkafka: no acknowledgement within the publish timeout")
)

// messageErrors are the broker's answers caused by the message, or by its
// topic alone, that the same message would get again: retrying soon cannot
// help, so it spends an attempt rather than stall the relay for every
// topic.
var messageErrors = []error{
	// Over the topic's max.message.bytes, or alone over the client's
	// ProducerBatchMaxBytes (the client refuses it before sending).
	kerr.MessageTooLarge,
	// A batch over the broker's segment size.
	kerr.RecordListTooLarge,
	// Refused by the broker's record validation: a keyless message to a
	// compacted topic, a malformed header.
	kerr.InvalidRecord,
	// The topic cannot be written: an internal topic, an invalid name.
	kerr.InvalidTopicException,
	// No ACL lets this client write the topic: the topic's messages fail
	// until an operator grants it; the relay keeps the other topics going.
	kerr.TopicAuthorizationFailed,
	// A topic policy refused the write.
	kerr.PolicyViolation,
}

// Class is how a publish error counts for the relay.
type Class int

const (
	// Infrastructure: the cluster could not be reached, did not answer in
	// time, or is in a state that passes. The relay spends no attempt.
	Infrastructure Class = iota
	// Message: the message, or its topic, was refused. The relay spends one
	// attempt and backs the message off.
	Message
	// Unconfirmed: the topic is unknown to the broker that answered. If
	// the cluster confirms that it does not exist this is a message
	// failure (ErrNoTopic); otherwise infrastructure. The Publisher settles
	// it with a metadata lookup before calling done; only Classify's
	// caller ever sees it.
	Unconfirmed
)

func (c Class) String() string {
	switch c {
	case Infrastructure:
		return "infrastructure"
	case Message:
		return "message"
	case Unconfirmed:
		return "unconfirmed"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Classify tells how err, reported for a produce, counts for the relay.
// err must not be nil.
//
//   - Message: an error wrapped with postbox.NewMessageError; ErrNoTopic,
//     ErrInvalidTopic, ErrInvalidHeader, ErrNoID; kerr.MessageTooLarge,
//     kerr.RecordListTooLarge, kerr.InvalidRecord,
//     kerr.InvalidTopicException, kerr.TopicAuthorizationFailed,
//     kerr.PolicyViolation.
//   - Unconfirmed: kerr.UnknownTopicOrPartition, kerr.UnknownTopicID.
//   - Infrastructure: everything else: context errors, ErrClosed,
//     ErrPublishTimeout, kerr.NotEnoughReplicas,
//     kerr.NotEnoughReplicasAfterAppend, kerr.NotLeaderForPartition,
//     kerr.RequestTimedOut, kerr.ClusterAuthorizationFailed,
//     kerr.InvalidTimestamp (the relay's clock is off), kgo.ErrRecordTimeout,
//     kgo.ErrRecordRetries, kgo.ErrClientClosed, network errors, and
//     unknown errors. An unknown error is treated as the cluster's fault on
//     purpose: that costs a pause and never an attempt, so it can delay a
//     message but never bury one.
func Classify(err error) Class {
	var me *postbox.MessageError
	switch {
	case errors.As(err, &me):
		return Message
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Infrastructure
	case errors.Is(err, ErrNoTopic), errors.Is(err, ErrInvalidTopic),
		errors.Is(err, ErrInvalidHeader), errors.Is(err, ErrNoID):
		return Message
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return Unconfirmed
	}
	for _, m := range messageErrors {
		if errors.Is(err, m) {
			return Message
		}
	}
	return Infrastructure
}
