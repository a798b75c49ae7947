package pubkit

import (
	"context"
	"errors"

	"github.com/postbox-go/postbox"
)

// MessageFault sorts a publish error by the rules every adapter shares.
// known is false when none applies, and the adapter looks at the error
// itself; otherwise message tells whether the message is at fault:
//
//   - an error wrapping a *postbox.MessageError (or a permanent failure)
//     is the message's;
//   - the end of a context is not: the message was not refused, its wait
//     was cut short;
//   - an error wrapping one of causes (the adapter's own message-failure
//     sentinels) is the message's.
//
// What no rule knows, an adapter counts as infrastructure on purpose:
// that costs a pause and never an attempt, so it can delay a message but
// never bury one.
func MessageFault(err error, causes ...error) (message, known bool) {
	switch {
	case postbox.IsMessageError(err):
		return true, true
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false, true
	}
	for _, c := range causes {
		if errors.Is(err, c) {
			return true, true
		}
	}
	return false, false
}

// Fault is how a publish error counts for the relay, for an adapter
// that cannot always tell at once.
type Fault int

const (
	// Infra: the broker could not be reached, did not answer in time, or
	// is in a state that passes. The relay spends no attempt, keeps the
	// message pending and pauses.
	Infra Fault = iota
	// Message: the message itself was refused. The adapter wraps the
	// error with postbox.NewMessageError; the relay spends one attempt
	// and backs the message off.
	Message
	// Permanent: the message can never be delivered (over the broker's
	// maximum size, a header the broker refuses). The adapter wraps the
	// error with postbox.Permanent; the relay moves the message to the
	// dead messages at once.
	Permanent
	// Unconfirmed: the broker did not know the message's destination
	// (stream, topic). Whether it exists is the question: the adapter
	// asks the broker before it calls done, and reports a message failure
	// only when the broker confirms that it does not.
	Unconfirmed
)
