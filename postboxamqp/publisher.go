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

	// slots is the MaxPending window: one token per publish the broker
	// has not settled (a suspect holds them all).
	slots chan struct{}
	// excl is held by a suspect while it collects the whole window, so
	// that ordinary publishes cannot starve it; they pass through it.
	excl    chan struct{}
	settled chan struct{} // a token after every settle, for Close
	closing chan struct{} // closed by Close

	ctx    context.Context // ends dials at Close
	cancel context.CancelFunc

	unroutable atomic.Int64
	nsuspects  atomic.Int32 // len(suspects)

	// noFrameCheck lets tests send a header frame over frame_max, to see
	// what the broker says.
	noFrameCheck bool

	mu       sync.Mutex
	closed   bool
	sess     *session      // the live session, nil when there is none
	dialing  chan struct{} // closed when the dial in progress ends; nil when none runs
	dialErr  error         // why the last dial failed
	failures int           // consecutive failed dials
	retryAt  time.Time     // no dial before this
	suspects map[string]bool
	wg       sync.WaitGroup // dials and session readers
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
	ctx, cancel := context.WithCancel(context.Background())
	return &Publisher{
		cfg:      c,
		dial:     dial,
		log:      c.Logger,
		slots:    make(chan struct{}, c.MaxPending),
		excl:     make(chan struct{}, 1),
		settled:  make(chan struct{}, 1),
		closing:  make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
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
func (p *Publisher) Pending() int { return len(p.slots) }

// Publish sends env to the exchange with the routing key of its topic and
// returns once the message is written to the connection. done is called
// exactly once:
//
//   - nil when the broker confirmed the message (basic.ack) and did not
//     return it; a returned message counts as published only when its
//     topic matches AcceptUnroutable, and is counted by Unroutable;
//   - a postbox.MessageError when the message itself was refused: returned
//     as unroutable, too large, an invalid routing key or header, or the
//     cause of a channel exception (see Classify);
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
	done(postbox.NewMessageError(fmt.Errorf("postboxamqp: publish %s: %w", env.ID, err)))
}

// acquire takes weight slots of the window, waiting until ctx ends or the
// Publisher closes.
func (p *Publisher) acquire(ctx context.Context, weight int) error {
	// Pass through excl, or hold it while collecting a whole window.
	select {
	case p.excl <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closing:
		return ErrClosed
	}
	if weight == 1 {
		<-p.excl
	}
	for n := 0; n < weight; n++ {
		var err error
		select {
		case p.slots <- struct{}{}:
			continue
		case <-ctx.Done():
			err = ctx.Err()
		case <-p.closing:
			err = ErrClosed
		}
		p.release(n)
		if weight > 1 {
			<-p.excl
		}
		return err
	}
	if weight > 1 {
		<-p.excl
	}
	return nil
}

// release frees n slots.
func (p *Publisher) release(n int) {
	for range n {
		<-p.slots
	}
	if n > 0 {
		select {
		case p.settled <- struct{}{}:
		default:
		}
	}
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
	if p.closed {
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
		p.dialing = wait
		p.wg.Add(1)
		go p.connect(wait)
	}
	p.mu.Unlock()
	select {
	case <-wait:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closing:
		return nil, ErrClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
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
	defer p.wg.Done()
	defer close(wait)
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	s, err := p.open(ctx)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialing = nil
	if p.closed {
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
	p.sess = s
	p.wg.Add(1)
	go s.run()
}

// lost forgets s once its connection is gone, so the next Publish dials.
// A lost session is re-dialed at once; only failed dials back off.
func (p *Publisher) lost(s *session, cause error) {
	p.mu.Lock()
	if p.sess == s {
		p.sess = nil
	}
	closed := p.closed
	p.mu.Unlock()
	if !closed {
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
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return nil
	}
	close(p.closing)
	var err error
	for err == nil && len(p.slots) > 0 {
		select {
		case <-p.settled:
		case <-ctx.Done():
			err = fmt.Errorf("postboxamqp: close: %d publishes unconfirmed: %w", len(p.slots), ctx.Err())
		}
	}
	p.cancel()
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
	waited := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("postboxamqp: close: %w", ctx.Err())
		}
	}
	return err
}

var _ postbox.Publisher = (*Publisher)(nil)
