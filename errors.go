package postbox

import (
	"errors"
	"fmt"
	"strings"

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

// IsMessageError reports whether err is (or wraps) a message failure.
func IsMessageError(err error) bool {
	var me *MessageError
	return errors.As(err, &me)
}
