package postboxkafka

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
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

// permanentCauses are the failures no retry can cure: this package's
// sentinels for a record it cannot build, and a record too large for the
// client or the topic. The relay buries such a message at once.
var permanentCauses = []error{
	ErrInvalidTopic, ErrInvalidHeader, ErrNoID,
	// Over the topic's max.message.bytes, or alone over the client's
	// ProducerBatchMaxBytes (the client refuses it before sending).
	kerr.MessageTooLarge,
	// A batch over the broker's segment size.
	kerr.RecordListTooLarge,
}

// messageCauses are this package's message-failure sentinels and the
// broker's answers caused by the message.
var messageCauses = append([]error{ErrNoTopic}, messageErrors...)

// classify tells how err, reported for a produce, counts for the relay.
// err must not be nil.
//
//   - pubkit.Permanent: a permanent failure already; ErrInvalidTopic,
//     ErrInvalidHeader, ErrNoID, kerr.MessageTooLarge,
//     kerr.RecordListTooLarge.
//   - pubkit.Message: what pubkit.MessageFault knows as the message's
//     (postbox.MessageError); ErrNoTopic, kerr.InvalidRecord,
//     kerr.InvalidTopicException, kerr.TopicAuthorizationFailed,
//     kerr.PolicyViolation.
//   - pubkit.Unconfirmed (a metadata lookup settles it):
//     kerr.UnknownTopicOrPartition, kerr.UnknownTopicID.
//   - pubkit.Infra: everything else: context errors, ErrClosed,
//     ErrPublishTimeout, kerr.NotEnoughReplicas,
//     kerr.NotEnoughReplicasAfterAppend, kerr.NotLeaderForPartition,
//     kerr.RequestTimedOut, kerr.ClusterAuthorizationFailed,
//     kerr.InvalidTimestamp (the relay's clock is off), kgo.ErrRecordTimeout,
//     kgo.ErrRecordRetries, kgo.ErrClientClosed, network errors, and
//     unknown errors.
func classify(err error) pubkit.Fault {
	if postbox.IsPermanent(err) {
		return pubkit.Permanent
	}
	for _, c := range permanentCauses {
		if errors.Is(err, c) {
			return pubkit.Permanent
		}
	}
	if message, known := pubkit.MessageFault(err, messageCauses...); known {
		if message {
			return pubkit.Message
		}
		return pubkit.Infra
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		return pubkit.Unconfirmed
	}
	return pubkit.Infra
}
