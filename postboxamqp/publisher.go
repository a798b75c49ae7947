package postboxamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// maxSuspects bounds the ids remembered as suspects of a channel exception.
const maxSuspects = 4096

// Publisher publishes envelopes to a RabbitMQ exchange with publisher
// confirms and reports each one done on its confirm. It implements
// postbox.Publisher; its methods are safe for concurrent use.
//
// It owns one connection with one confirm-mode channel at a time (a
// session). When the session is lost, the next Publish re-dials; only one
// dial runs at a time, Publishes arriving meanwhile wait for it within
// their context, and while a failed dial's backoff runs they fail at once
// with ErrNotConnected, an infrastructure failure that makes the relay
// pause.
type Publisher struct {
	cfg  *Config
	dial Dialer
	log  *slog.Logger

	// kit holds the MaxPending window (a slot per publish the broker has
	// not settled; a suspect holds them all), whether the Publisher is
	// closed, its goroutines (dials and session readers) and a context
	// that ends dials at Close.
	kit *pubkit.Kit

	unroutable atomic.Int64
	nsuspects  atomic.Int32 // len(suspects)

	// noFrameCheck lets tests send a header frame over frame_max, to see
	// what the broker says.
	noFrameCheck bool

	mu       sync.Mutex
	sess     *session      // the live session, nil when there is none
	dialing  chan struct{} // closed when the dial in progress ends; nil when none runs
	dialErr  error         // why the last dial failed
	failures int           // consecutive failed dials
	retryAt  time.Time     // no dial before this
	suspects map[string]bool
}

// New returns a Publisher that sends to cfg.Exchange over connections
// from dial (URL makes one from an AMQP URI). cfg may be nil for all
// defaults; an invalid one returns a *postbox.ConfigError naming every bad
// field.
//
// New does not connect: the first Publish does, so a relay starts while
// the broker is down and catches up once it is back. New declares
// nothing: the exchange, queues and bindings are topology, made with
// EnsureTopology or by the operator. Call Close when done.
func New(dial Dialer, cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if dial == nil {
		return nil, errors.New("postboxamqp: New needs a Dialer")
	}
	return &Publisher{
		cfg:      c,
		dial:     dial,
		log:      c.Logger,
		kit:      pubkit.New(c.MaxPending, ErrClosed),
		suspects: map[string]bool{},
	}, nil
}

// Config returns the publisher's configuration, defaults filled in.
func (p *Publisher) Config() Config { return *p.cfg }

// Unroutable counts the messages that no queue received and that
// AcceptUnroutable let count as published.
func (p *Publisher) Unroutable() int64 { return p.unroutable.Load() }

// Pending returns the number of publishes the broker has not settled yet,
// including those whose done was already called because their context
// ended or their timeout passed.
func (p *Publisher) Pending() int { return p.kit.Window().Pending() }

// Publish sends env to the exchange with the routing key of its topic and
// returns once the message is handed to the connection (written, or queued
// for the socket, see Connections in the package doc). done is called
// exactly once:
//
//   - nil when the broker confirmed the message (basic.ack) and did not
//     return it; a returned message counts as published only when its
//     topic matches AcceptUnroutable, and is counted by Unroutable;
//   - a postbox.MessageError when the message itself was refused: returned
//     as unroutable, too large, an invalid routing key or header, or the
//     cause of a channel exception;
//   - ctx.Err() when ctx ends first;
//   - any other error for an infrastructure failure: no connection, the
//     connection or channel lost before the confirm, basic.nack, no
//     confirm within PublishTimeout, a blocked connection, no exchange.
//
// done runs on the caller's goroutine, the Publisher's reader, or the
// goroutine that sees the context end, and must not block. Publish blocks while MaxPending publishes are unsettled, and
// while a connection is being dialed, until ctx ends.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	if err := ctx.Err(); err != nil {
		done(err)
		return
	}
	msg, size, err := p.publishing(env)
	if err == nil {
		var rk string
		if rk, err = p.routingKey(env.Topic); err == nil {
			p.send(ctx, env, rk, msg, size, done)
			return
		}
	}
	done(postbox.Permanent(fmt.Errorf("postboxamqp: publish %s: %w", env.ID, err)))
}

// CheckMessage implements postbox.MessageChecker: what Publish could
// never send is refused when the message is written. It builds the AMQP
// message as Publish does, so a payload over MaxMessageSize, a header
// AMQP cannot carry or RabbitMQ reserves, a topic over 255 bytes, and a
// routing key AMQP cannot carry are refused. The connection's frame_max
// is known only once connected; a message whose properties exceed it is
// dead at its first publish.
func (p *Publisher) CheckMessage(env *postbox.Envelope) error {
	if _, _, err := p.publishing(env); err != nil {
		return err
	}
	_, err := p.routingKey(env.Topic)
	return err
}

// suspect reports whether id was in flight when the broker closed a
// channel over some message's content.
func (p *Publisher) suspect(id string) bool {
	if p.nsuspects.Load() == 0 {
		return false // the usual case, without the lock
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.suspects[id]
}

func (p *Publisher) markSuspect(id string) {
	p.mu.Lock()
	if len(p.suspects) < maxSuspects {
		p.suspects[id] = true
	}
	p.nsuspects.Store(int32(len(p.suspects)))
	p.mu.Unlock()
}

func (p *Publisher) clearSuspect(id string) {
	p.mu.Lock()
	delete(p.suspects, id)
	p.nsuspects.Store(int32(len(p.suspects)))
	p.mu.Unlock()
}

// session returns the live session, dialing one when there is none: one
// dial at a time, which every caller waits for within its context. While
// the backoff after a failed dial runs, it fails at once.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	p.mu.Lock()
	if p.kit.Closed() {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if s := p.sess; s != nil {
		p.mu.Unlock()
		return s, nil
	}
	wait := p.dialing
	if wait == nil {
		if time.Now().Before(p.retryAt) {
			err := fmt.Errorf("%w (retrying in %s): %w", ErrNotConnected, time.Until(p.retryAt).Round(time.Millisecond), p.dialErr)
			p.mu.Unlock()
			return nil, err
		}
		wait = make(chan struct{})
		if !p.kit.Go(func() { p.connect(wait) }) {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		p.dialing = wait
	}
	p.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.kit.Closing():
		return nil, ErrClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.kit.Closed():
		return nil, ErrClosed
	case p.sess != nil:
		return p.sess, nil
	case p.dialErr != nil:
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, p.dialErr)
	}
	return nil, ErrNotConnected
}

// connect dials a session and installs it; wait is closed once it is
// done, either way.
func (p *Publisher) connect(wait chan struct{}) {
	defer close(wait)
	ctx, cancel := context.WithTimeout(p.kit.Context(), p.cfg.DialTimeout)
	s, err := p.open(ctx)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing = nil
	if p.kit.Closed() {
		if s != nil {
			closeConn(s.conn)
		}
		return
	}
	if err != nil {
		p.failures++
		p.dialErr = err
		p.retryAt = time.Now().Add(backoff(p.failures, p.cfg.ReconnectBackoff, p.cfg.ReconnectBackoffMax))
		p.log.Warn("postboxamqp: connect failed", slog.Int("failures", p.failures), slog.Any("error", err))
		return
	}
	if p.failures > 0 {
		p.log.Info("postboxamqp: reconnected", slog.Int("after_failures", p.failures))
	}
	p.failures, p.dialErr = 0, nil
	// The reader's first step that needs p.mu (lost) waits until the
	// session is installed.
	if !p.kit.Go(s.run) {
		closeConn(s.conn)
		return
	}
	p.sess = s
}

// lost forgets s once its connection is gone, so the next Publish dials.
// A lost session is re-dialed at once; only failed dials back off.
func (p *Publisher) lost(s *session, cause error) {
	p.mu.Lock()
	if p.sess == s {
		p.sess = nil
	}
	p.mu.Unlock()
	if !p.kit.Closed() {
		p.log.Warn("postboxamqp: connection lost", slog.Any("error", cause))
	}
}

// Close stops the publisher. Every later Publish fails with ErrClosed. It
// waits, until ctx ends, for the publishes in flight to be confirmed;
// those still unconfirmed then fail with an error wrapping ErrClosed (an
// infrastructure failure: the relay publishes them again). Then it closes
// the connection and waits, until ctx ends, for its goroutines to exit.
// Calling Close again does nothing.
func (p *Publisher) Close(ctx context.Context) error {
	if !p.kit.Close() {
		return nil
	}
	var err error
	if e := p.kit.Window().Drain(ctx); e != nil {
		err = fmt.Errorf("postboxamqp: close: %d publishes unconfirmed: %w", p.kit.Window().Pending(), e)
	}
	p.kit.Cancel()
	p.mu.Lock()
	s := p.sess
	p.sess = nil
	p.mu.Unlock()
	if s != nil {
		deadline := time.Now().Add(closeWait)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		s.shut(deadline)
	}
	if e := p.kit.Wait(ctx); e != nil && err == nil {
		err = fmt.Errorf("postboxamqp: close: %w", e)
	}
	return err
}

var _ postbox.Publisher = (*Publisher)(nil)
