package postbox

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/postbox-go/postbox/internal/printable"
)

// Sentinel errors for states.
var (
	// ErrNoPublisher is returned by Start on a Client configured without a
	// Publisher: such a Client can write but not relay.
	ErrNoPublisher = errors.New("postbox: no publisher configured")
	// ErrStarted is returned by Start on a Client that is already running.
	ErrStarted = errors.New("postbox: client already started")
	// ErrNotStarted is returned by Stop on a Client that is not running.
	ErrNotStarted = errors.New("postbox: client not started")
)

// maxErrorBytes bounds an error message stored with a message.
const maxErrorBytes = 2000

// truncate cuts s to at most n bytes on a character boundary.
func truncate(s string, n int) string { return printable.Cut(s, n) }

// errorText is err's message as it is stored with a failed or dead
// message: valid UTF-8 without NUL (which PostgreSQL's text refuses, and
// with it the whole statement recording a batch's failures), at most
// maxErrorBytes, never cut inside a character.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return printable.Cut(s, maxErrorBytes)
}

// ValidationError reports one bad input: a message field, a config field,
// a topic. Nothing is written when one is returned.
type ValidationError struct {
	Field  string // the field at fault, e.g. "messages[2].topic" or "BatchSize"
	Value  string // the offending value, shortened for display
	Reason string // what is wrong with it
}

func (e *ValidationError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("postbox: invalid %s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("postbox: invalid %s %q: %s", e.Field, e.Value, e.Reason)
}

func invalid(field string, value any, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Value: printable.Shorten(fmt.Sprint(value), 64), Reason: fmt.Sprintf(format, args...)}
}

// ConfigError lists every invalid field of a Config at once.
type ConfigError struct {
	Problems []*ValidationError
}

func (e *ConfigError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = strings.TrimPrefix(p.Error(), "postbox: ")
	}
	return fmt.Sprintf("postbox: invalid config (%d problems): %s", len(parts), strings.Join(parts, "; "))
}

// Unwrap exposes each problem to errors.As and errors.Is.
func (e *ConfigError) Unwrap() []error {
	out := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p
	}
	return out
}

// MessageError marks a publish failure caused by the message itself: the
// broker rejected it, it is too large, it cannot be routed. The relay spends
// one of the message's attempts, backs it off, and buries it after
// MaxAttempts.
//
// Any other publish error is an infrastructure failure (broker unreachable,
// timeout, connection lost): the relay spends no attempt, leaves the message
// pending and pauses. Publishers wrap message-level failures with
// NewMessageError; anything they do not wrap is treated as infrastructure.
type MessageError struct {
	Err error
}

// NewMessageError wraps err as a message failure.
func NewMessageError(err error) error { return &MessageError{Err: err} }

func (e *MessageError) Error() string { return e.Err.Error() }
func (e *MessageError) Unwrap() error { return e.Err }

// IsMessageError reports whether err is (or wraps) a message failure: a
// MessageError, a permanent failure (Permanent) or a counted retry-after
// (RetryAfter with counted set).
func IsMessageError(err error) bool {
	var me *MessageError
	if errors.As(err, &me) || IsPermanent(err) {
		return true
	}
	var ra *RetryAfterError
	return errors.As(err, &ra) && ra.Counted
}

// PermanentError marks a failure that no retry can cure: a payload above
// the broker's maximum, a header the broker refuses, a message the handler
// can never apply. Permanent makes one.
type PermanentError struct {
	Err error
}

// Permanent wraps err as a permanent failure, or returns nil for nil.
//
// A publisher returning it (to the relay's done) sends the message to the
// dead messages at once, spending one attempt instead of the whole budget
// and holding back its key for no backoff. A handler returning it (to
// Inbox.Handle, Processor, BatchProcessor) makes a consumer dead message at
// once, with no redelivery. Either way the message waits there for an
// operator to requeue or delete it (docs/design.md §4).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is (or wraps) a permanent failure.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// CrashLoopError is the error of a consumer dead message whose handler
// never returned: Crashes redeliveries in a row began running it and
// ended with the consuming process gone (Config.MaxCrashes).
type CrashLoopError struct {
	Crashes int
}

func (e *CrashLoopError) Error() string {
	return fmt.Sprintf("postbox: the handler never returned: %d redeliveries in a row ended with the consuming process gone while it ran (Config.MaxCrashes)", e.Crashes)
}

// RetryAfterError is a failure that names when to try again. RetryAfter
// makes one.
type RetryAfterError struct {
	Err error
	// Delay is how long to wait before the next attempt; never negative.
	Delay time.Duration
	// Counted says whether the failure spends one of the message's
	// attempts (MaxAttempts).
	Counted bool
}

// RetryAfter wraps err as a failure to try again after delay (a negative
// delay counts as 0), or returns nil for nil. counted says whether it
// spends one of the message's attempts.
//
// From a handler (Inbox): the delivery is redelivered after delay, instead
// of after the backoff. Counted, the attempt is recorded and the failure
// that spends the budget makes a dead message as any other; uncounted,
// nothing is recorded and the handler's budget stays as it was, so a
// handler that always asks for an uncounted retry is retried for ever.
//
// From a publisher (the relay): counted, it is a message failure whose
// backoff is delay, and the message's key waits behind it; uncounted, it
// is an infrastructure failure, spending no attempt: the relay pauses the
// lane by its own infrastructure backoff (50 ms doubling up to 10 s), not
// by delay, and the message stays first in line.
func RetryAfter(err error, delay time.Duration, counted bool) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{Err: err, Delay: max(delay, 0), Counted: counted}
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// retryAfter returns the retry-after err carries, if any, unless err is
// also permanent (a permanent failure is never retried).
func retryAfter(err error) (*RetryAfterError, bool) {
	var ra *RetryAfterError
	if IsPermanent(err) || !errors.As(err, &ra) {
		return nil, false
	}
	return ra, true
}
