package postbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrNoHandler is the message failure LocalHandlers returns for a topic
// with no handler registered.
var ErrNoHandler = errors.New("postbox: no local handler for the topic")

// LocalFunc handles one message in process.
type LocalFunc func(ctx context.Context, env *Envelope) error

// LocalHandlers is a Publisher that runs Go functions instead of talking
// to a broker, for modular monoliths: the relay delivers each message to
// the function registered for its topic, with the same guarantees as a
// broker publish. A message is marked published when its function returns
// nil; messages of one key run one at a time, in write order; an error
// spends an attempt, backs off and, after the budget, buries the message
// in the dead table. A panic counts as an error.
//
// Delivery is at least once, as with a broker: a relay that crashes after
// a function returned but before the mark runs it again. Functions that
// change a database should go through an Inbox, or be idempotent.
type LocalHandlers struct {
	mu       sync.RWMutex
	handlers map[string]LocalFunc
}

// NewLocalHandlers returns an empty registry.
func NewLocalHandlers() *LocalHandlers {
	return &LocalHandlers{handlers: map[string]LocalFunc{}}
}

// Register registers fn for topic, replacing any earlier one. It returns a
// *ValidationError for an invalid topic.
func (l *LocalHandlers) Register(topic string, fn LocalFunc) error {
	if err := ValidateTopic(topic); err != nil {
		return err
	}
	if fn == nil {
		return invalid("fn", "", "is nil")
	}
	l.mu.Lock()
	l.handlers[topic] = fn
	l.mu.Unlock()
	return nil
}

// Topics lists the topics with a handler.
func (l *LocalHandlers) Topics() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]string, 0, len(l.handlers))
	for t := range l.handlers {
		out = append(out, t)
	}
	return out
}

// Publish implements Publisher: it runs the topic's function in a
// goroutine of its own, so that the relay's window runs handlers of
// different keys in parallel.
func (l *LocalHandlers) Publish(ctx context.Context, env *Envelope, done func(error)) {
	l.mu.RLock()
	fn := l.handlers[env.Topic]
	l.mu.RUnlock()
	if fn == nil {
		done(NewMessageError(fmt.Errorf("%w %q", ErrNoHandler, env.Topic)))
		return
	}
	go func() {
		done(runLocal(ctx, fn, env))
	}()
}

func runLocal(ctx context.Context, fn LocalFunc, env *Envelope) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = NewMessageError(fmt.Errorf("local handler for %q panicked: %v", env.Topic, p))
		}
	}()
	if err := fn(ctx, env); err != nil {
		if ctx.Err() != nil {
			// The batch's deadline or a stop ended it: not the message's fault.
			return ctx.Err()
		}
		if IsPermanent(err) || IsMessageError(err) {
			return err // named by the function: permanent, a counted retry-after
		}
		if _, ok := retryAfter(err); ok {
			return err // an uncounted retry-after spends no attempt
		}
		return NewMessageError(err)
	}
	return nil
}
