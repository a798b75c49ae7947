package postboxamqp

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// session is one connection with one channel in confirm mode. Its reader
// goroutine (run) turns confirms and returns into done calls, and fails
// whatever is left when the channel closes.
type session struct {
	p        *Publisher
	conn     *amqp.Connection
	ch       *amqp.Channel
	frameMax int // negotiated frame_max; 0 means unlimited

	// Buffered for MaxPending: every confirm and return belongs to a
	// publish holding a slot, so the client's reader never waits on them.
	// (amqp091 drops a notification it cannot hand over within 5s; a
	// dropped return would let an unroutable message count as published.)
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closes   chan *amqp.Error
	blocks   chan amqp.Blocking

	// gate serializes publishes on the channel, so the delivery tag of the
	// next publish is known before it is sent and its flight registered
	// first: the confirm can arrive before the send returns. A channel
	// rather than a mutex, so that waiting for it ends with the context.
	gate chan struct{}

	mu      sync.Mutex
	dead    bool
	closing bool   // Close shut it: what is left fails with ErrClosed
	blocked string // the broker's reason while connection.blocked holds
	pending map[uint64]*flight
	byID    map[string][]uint64 // message id -> tags in flight, ascending
}

// flight is one publish awaiting its confirm. The broker's answer
// (confirm, channel loss) and the end of the publish's context or its
// timeout race to its done. Say the timeout fires while the ack is being
// read: the timeout reports an infrastructure failure, and the ack's
// outcome is dropped; the relay sends the message again later with the
// same message-id, and the consumers' inbox absorbs the copy. Its slots
// are freed when the broker settles it.
type flight struct {
	pubkit.Flight
	id       string
	topic    string
	key      string // routing key
	accept   bool   // AcceptUnroutable matched its topic
	weight   int    // window slots held
	tag      uint64
	returned string // the basic.return's reply, when the broker returned it
}

// open dials a connection and opens a confirm-mode channel on it.
func (p *Publisher) open(ctx context.Context) (*session, error) {
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, err
	}
	// Channel and Confirm wait for the broker's answer without a context:
	// closing the connection when ctx ends makes them return.
	stop := context.AfterFunc(ctx, func() { closeConn(conn) })
	defer stop()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		closeConn(conn)
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, err
	}
	s := &session{
		p: p, conn: conn, ch: ch, frameMax: conn.Config.FrameSize,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, p.cfg.MaxPending)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, p.cfg.MaxPending)),
		closes:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		blocks:   conn.NotifyBlocked(make(chan amqp.Blocking, 4)),
		gate:     make(chan struct{}, 1),
		pending:  make(map[uint64]*flight, p.cfg.MaxPending),
		byID:     make(map[string][]uint64, p.cfg.MaxPending),
	}
	return s, nil
}

// send publishes env's message on the live session.
func (p *Publisher) send(ctx context.Context, env *postbox.Envelope, key string, msg amqp.Publishing, size int, done func(error)) {
	weight := 1
	if p.suspect(env.ID) {
		// In flight when the broker closed a channel over a message's
		// content: it goes alone, so that if it is the cause, it alone
		// is blamed.
		weight = p.cfg.MaxPending
	}
	w := p.kit.Window()
	if err := w.Acquire(ctx, weight); err != nil {
		done(err)
		return
	}
	s, err := p.session(ctx)
	if err != nil {
		w.Release(weight)
		done(err)
		return
	}
	if s.frameMax > 0 && size > s.frameMax && !p.noFrameCheck {
		w.Release(weight)
		done(postbox.Permanent(fmt.Errorf("postboxamqp: publish %s: %w: properties and headers take %d bytes, over the connection's frame_max %d", env.ID, ErrTooLarge, size, s.frameMax)))
		return
	}
	f := &flight{id: env.ID, topic: env.Topic, key: key, weight: weight}
	f.accept = !p.cfg.DisableMandatory && matchAny(p.cfg.AcceptUnroutable, env.Topic)
	f.Start(done)
	f.Hold(w, weight)
	f.Watch(ctx, p.cfg.PublishTimeout, func(ctxErr error) error {
		if ctxErr != nil {
			return ctxErr
		}
		return fmt.Errorf("postboxamqp: publish %s: %w (%s)", f.id, ErrPublishTimeout, p.cfg.PublishTimeout)
	})
	if err := s.publish(ctx, f, msg); err != nil {
		f.Settle(err)
	}
}

// publish registers f and sends msg. It returns an error only when f was
// not registered; once it is, every outcome goes through settle.
func (s *session) publish(ctx context.Context, f *flight, msg amqp.Publishing) error {
	select {
	case s.gate <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.gate }()
	s.mu.Lock()
	switch {
	case s.dead:
		s.mu.Unlock()
		return fmt.Errorf("postboxamqp: publish %s: %w", f.id, ErrConnectionLost)
	case s.blocked != "":
		reason := s.blocked
		s.mu.Unlock()
		return fmt.Errorf("postboxamqp: publish %s: %w: %s", f.id, ErrBlocked, reason)
	}
	f.tag = s.ch.GetNextPublishSeqNo()
	s.pending[f.tag] = f
	s.byID[f.id] = append(s.byID[f.id], f.tag)
	s.mu.Unlock()
	p := s.p
	dc, err := s.ch.PublishWithDeferredConfirm(p.cfg.Exchange, f.key, !p.cfg.DisableMandatory, false, msg)
	if err != nil {
		// The channel closed under the publish (the broker may have
		// closed it over this very message: its exception races with
		// the rest of our frames), or a frame could not be written,
		// which shuts the connection down. f stays pending and the
		// session is given up: the reader's die settles f with the
		// broker's cause, which is what classifies a content fault;
		// settling here would report the client's 504 instead. The
		// client took f's delivery tag back, so no publish may reuse
		// it meanwhile: dead turns the next ones away.
		//
		// Either way the client closes the channel itself, which ends
		// the reader with the cause. Closing the connection here at
		// once would race the broker's channel.close still on its way
		// in, and the channel would end with our close instead of the
		// broker's 406: the message never seen as a suspect. Only if
		// the reader has not ended the session by then is the
		// connection closed, after a grace.
		s.mu.Lock()
		s.dead = true
		s.mu.Unlock()
		time.AfterFunc(closeWait, func() { closeConn(s.conn) })
		return nil
	}
	if dc != nil && dc.DeliveryTag != f.tag {
		// Cannot happen while the gate serializes every publish on the
		// channel; if it ever did, confirms would settle the wrong
		// messages, so give the session up.
		p.log.Error("postboxamqp: delivery tag mismatch; dropping the connection", slog.Uint64("want", f.tag), slog.Uint64("got", dc.DeliveryTag))
		go closeConn(s.conn)
	}
	return nil
}

// take removes the flight of tag; nil when another path settled it first.
func (s *session) take(tag uint64) *flight {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.pending[tag]
	if f == nil {
		return nil
	}
	delete(s.pending, tag)
	tags := s.byID[f.id]
	for i, t := range tags {
		if t == tag {
			tags = append(tags[:i], tags[i+1:]...)
			break
		}
	}
	if len(tags) == 0 {
		delete(s.byID, f.id)
	} else {
		s.byID[f.id] = tags
	}
	return f
}

// run is the session's reader: it settles flights as the broker answers,
// and fails the rest once the channel closes.
func (s *session) run() {
	returns, blocks := s.returns, s.blocks
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.returned(&r)
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			s.setBlocked(b)
		case c, ok := <-s.confirms:
			if !ok {
				// The client closes the returns before the confirms.
				if returns != nil {
					for r := range returns {
						s.returned(&r)
					}
				}
				s.die(<-s.closes)
				return
			}
			// A return precedes the confirm of its message on the wire,
			// and the client hands both over in that order from one
			// goroutine: every return for this confirm is buffered now.
			returns = s.drainReturns(returns)
			s.confirmed(c)
		}
	}
}

func (s *session) drainReturns(returns chan amqp.Return) chan amqp.Return {
	for returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				return nil
			}
			s.returned(&r)
		default:
			return returns
		}
	}
	return nil
}

// returned marks the flight a basic.return is about. Returns carry the
// message-id, not the delivery tag: the return goes to the oldest flight
// of that id not yet returned. Two flights share an id only when one
// message is published twice at once (two relays racing on an expired
// lease); both route by the same routing key, so they share one fate, and
// the match cannot mislabel which copy was stored.
func (s *session) returned(r *amqp.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tag := range s.byID[r.MessageId] {
		if f := s.pending[tag]; f != nil && f.returned == "" {
			f.returned = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
			return
		}
	}
	s.p.log.Warn("postboxamqp: basic.return for no message in flight", slog.String("id", r.MessageId), slog.Int("code", int(r.ReplyCode)))
}

func (s *session) setBlocked(b amqp.Blocking) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !b.Active {
		s.blocked = ""
		return
	}
	s.blocked = b.Reason
	if s.blocked == "" {
		s.blocked = "connection.blocked"
	}
}

func (s *session) confirmed(c amqp.Confirmation) {
	f := s.take(c.DeliveryTag)
	if f == nil {
		return
	}
	var err error
	switch {
	case !c.Ack:
		// RabbitMQ nacks when a queue process failed, or a queue with
		// x-overflow=reject-publish is full: the broker's state, not the
		// message's fault, and it passes.
		err = fmt.Errorf("postboxamqp: publish %s: %w", f.id, ErrNacked)
	case f.returned != "":
		err = s.unroutable(f)
	case f.weight > 1:
		s.p.clearSuspect(f.id)
	}
	f.Settle(err)
}

// unroutable is the outcome of a returned message.
func (s *session) unroutable(f *flight) error {
	if f.accept {
		s.p.unroutable.Add(1)
		if s.p.cfg.OnUnroutable != nil {
			s.p.cfg.OnUnroutable(f.topic)
		}
		return nil
	}
	return postbox.NewMessageError(fmt.Errorf("postboxamqp: publish %s: %w: exchange %q, routing key %q: %s", f.id, ErrUnroutable, s.p.cfg.Exchange, configcheck.Shorten(f.key), f.returned))
}

// die fails every flight left once the channel closed with cause (nil for
// a close of our own).
//
// A channel exception raised over the content of a publish does not say
// which publish. Every flight left fails as infrastructure and its id
// becomes a suspect, which its next attempt sends alone; a suspect that
// is the only flight left when a content exception comes again is blamed:
// a message failure. A first sighting is never blamed, even alone: the
// publish at fault may have been settled on another path (a failed
// write), leaving an innocent one as the only flight.
func (s *session) die(cause *amqp.Error) {
	s.mu.Lock()
	s.dead = true
	left := s.pending
	s.pending, s.byID = nil, nil
	closing := s.closing
	s.mu.Unlock()
	closeConn(s.conn) // a channel exception leaves the connection open
	why := ErrConnectionLost
	switch {
	case cause != nil:
		why = cause
	case closing:
		why = ErrClosed
	}
	s.p.lost(s, why)
	fault := contentFault(cause)
	for _, f := range left {
		var err error
		switch {
		case f.returned != "":
			err = s.unroutable(f)
		case fault && len(left) == 1 && s.p.suspect(f.id):
			// Alone in flight when the broker closed the channel over a
			// message's content (over max_message_size, a property it
			// refuses): the same message would be refused again.
			err = postbox.Permanent(fmt.Errorf("postboxamqp: publish %s: %w: %w", f.id, ErrRejected, cause))
		case closing && cause == nil:
			err = fmt.Errorf("postboxamqp: publish %s: %w", f.id, ErrClosed)
		default:
			if fault {
				s.p.markSuspect(f.id)
			}
			err = lostError(f.id, cause)
		}
		f.Settle(err)
	}
}

// shut closes the session for Close, waiting for the broker until
// deadline at most: what is left fails with ErrClosed.
func (s *session) shut(deadline time.Time) {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	closeConnBy(s.conn, deadline)
}
