package postboxredis

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Errors this package reports as the cause of a message failure. The
// Publisher wraps them with postbox.NewMessageError; errors.Is finds them
// through that wrapper.
var (
	// ErrNoStream means the message's stream does not exist. Publishing
	// never creates a stream (XADD NOMKSTREAM): streams are topology, made
	// with EnsureGroup or by the operator.
	ErrNoStream = errors.New("postboxredis: the stream does not exist")
	// ErrWrongType means the message's stream name holds a key of another
	// type (a string, a hash, ...).
	ErrWrongType = errors.New("postboxredis: the key is not a stream")
	// ErrInvalidStream means the topic mapped to a stream name this
	// package refuses (see ValidateStreamName).
	ErrInvalidStream = errors.New("postboxredis: invalid stream name")
	// ErrTooLarge means the entry is over Config.MaxEntryBytes.
	ErrTooLarge = errors.New("postboxredis: entry too large")
	// ErrInvalidHeader means a header name or value is not valid UTF-8,
	// so it cannot travel in the entry's JSON headers field unchanged.
	ErrInvalidHeader = errors.New("postboxredis: invalid header")
	// ErrNoID means the envelope carries no usable message id: empty,
	// over MaxIDBytes, or holding control characters.
	ErrNoID = errors.New("postboxredis: envelope has no usable message id")
)

// Errors of infrastructure failures.
var (
	// ErrClosed is the failure of publishes cut off by Close, and of
	// every Publish after it.
	ErrClosed = errors.New("postboxredis: publisher closed")
	// ErrPublishTimeout means Redis did not answer within
	// Config.PublishTimeout. The entry may have been stored; its retry
	// carries the same id and the dedupe guard absorbs it.
	ErrPublishTimeout = errors.New("postboxredis: no reply within the publish timeout")
	// ErrNotReplicated means fewer than Config.MinReplicas replicas
	// confirmed the write (WAIT) within Config.ReplicaTimeout. The entry
	// is stored on the primary; its retry is absorbed by the dedupe guard.
	ErrNotReplicated = errors.New("postboxredis: write not confirmed by enough replicas")
)

// ErrNoGroup means the consumer group (or its stream) does not exist:
// subscribing creates neither, EnsureGroup does.
var ErrNoGroup = errors.New("postboxredis: the consumer group does not exist")

// messageReplyPrefixes are the Redis error replies caused by the message
// and returned again for the same message, so that retrying it soon
// cannot help. Every other error reply (LOADING, READONLY, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN, NOREPLICAS, BUSY, OOM, NOAUTH, WRONGPASS,
// NOPERM, max clients, ...) is a state of the server or of its
// configuration, and counts as infrastructure.
var messageReplyPrefixes = []string{
	"WRONGTYPE ",
	// The keys of one entry (its stream and its dedupe key) always share
	// a slot; a stream name that breaks that is the topic's mapping.
	"CROSSSLOT ",
	// An argument over the server's proto-max-bulk-len. The server closes
	// the connection after this reply, so the rest of the pipeline fails
	// as infrastructure; Config.MaxEntryBytes keeps such entries from
	// being sent.
	"ERR Protocol error: invalid bulk length",
	"ERR string exceeds maximum allowed size",
}

// isMessageFault tells whether err, returned by a publish or an ack, is
// the message's fault. err must not be nil.
//
//   - The message's: what pubkit.MessageFault knows as the message's
//     (postbox.MessageError); ErrNoStream, ErrWrongType, ErrInvalidStream,
//     ErrTooLarge, ErrInvalidHeader, ErrNoID; and the error replies
//     WRONGTYPE, CROSSSLOT and an argument over the server's
//     proto-max-bulk-len.
//   - Infrastructure: everything else: context errors, ErrClosed,
//     ErrPublishTimeout, ErrNotReplicated, network errors (connection
//     refused, reset, EOF, timeouts), redis.ErrClosed, pool timeouts, the
//     error replies LOADING, READONLY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN,
//     NOREPLICAS, BUSY, OOM, NOAUTH, WRONGPASS, NOPERM and "max number of
//     clients", and unknown errors.
func isMessageFault(err error) bool {
	if message, known := pubkit.MessageFault(err, ErrNoStream, ErrWrongType, ErrInvalidStream,
		ErrTooLarge, ErrInvalidHeader, ErrNoID); known {
		return message
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		for _, p := range messageReplyPrefixes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// permanentReplyPrefixes are the error replies among them that no retry
// can cure: the entry is too large for the server.
var permanentReplyPrefixes = []string{
	"ERR Protocol error: invalid bulk length",
	"ERR string exceeds maximum allowed size",
}

// isPermanent tells whether err, a message fault, can never be cured:
// ErrInvalidStream, ErrTooLarge, ErrInvalidHeader, ErrNoID (an entry this
// package cannot build), and an argument over the server's
// proto-max-bulk-len.
func isPermanent(err error) bool {
	if postbox.IsPermanent(err) {
		return true
	}
	for _, c := range [...]error{ErrInvalidStream, ErrTooLarge, ErrInvalidHeader, ErrNoID} {
		if errors.Is(err, c) {
			return true
		}
	}
	var re redis.Error
	if errors.As(err, &re) {
		for _, p := range permanentReplyPrefixes {
			if strings.HasPrefix(re.Error(), p) {
				return true
			}
		}
	}
	return false
}

// classified wraps err for done: permanent failures with
// postbox.Permanent, other message failures with postbox.NewMessageError,
// the rest as they are.
func classified(err error) error {
	switch {
	case postbox.IsPermanent(err):
		return err
	case isMessageFault(err) && isPermanent(err):
		return postbox.Permanent(err)
	case isMessageFault(err) && !postbox.IsMessageError(err):
		return postbox.NewMessageError(err)
	}
	return err
}
