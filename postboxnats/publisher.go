package postboxnats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/brokerutil"
)

// Publisher publishes envelopes to JetStream and reports each one done on
// its PubAck. It implements postbox.Publisher; its methods are safe for
// concurrent use.
//
// Acks are awaited without a goroutine per message: the Publisher owns a
// JetStream context of its own on the caller's connection, whose ack and
// error handlers look the message up and call its done. A publish costs a
// map entry, the client's own ack timer, and a context.AfterFunc
// registration for its context.
type Publisher struct {
	cfg     *Config
	js      jetstream.JetStream
	slots   chan struct{} // the MaxPending window: one token per publish the broker has not settled
	closing chan struct{} // closed by Close, wakes a Publish waiting for a slot
	ctx     context.Context
	cancel  context.CancelFunc // ends stream lookups at Close

	// gate keeps Close out while a Publish is inside the client: after
	// CleanupPublisher, a late PublishMsgAsync would resubscribe the
	// reply subject and nothing would ever clean it up again.
	gate sync.RWMutex

	mu       sync.Mutex
	closed   bool
	inflight map[*nats.Msg]*flight // sent, awaiting the broker's answer
	lookups  map[string][]waiter   // subject -> publishes awaiting a stream lookup
	wg       sync.WaitGroup        // lookups and timeout hand-offs
}

// flight is one publish awaiting its outcome.
type flight struct {
	id      string
	subject string
	done    func(error)
	called  atomic.Bool
	stop    func() bool // unregisters the context watch; set before the flight is shared
}

// finish calls done once. Two paths race to it: the broker's answer (ack,
// error, timeout) and the end of the publish's context. Say the context
// ends while the ack is being read: its AfterFunc calls finish(ctx.Err())
// and wins the swap; the ack handler's finish(nil) then does nothing, and
// the relay treats the message as not published, so it sends it again
// later, with the same Nats-Msg-Id, which JetStream answers as a
// duplicate. The other order reports the ack and the context's end is
// ignored. Either way done runs exactly once.
func (f *flight) finish(err error) {
	if f.called.CompareAndSwap(false, true) {
		f.done(err)
	}
}

type waiter struct {
	f     *flight
	cause error
}

// New returns a Publisher that publishes through js's connection, with
// js's API prefix or domain. cfg may be nil for all defaults; an invalid
// one returns a *postbox.ConfigError naming every bad field.
//
// New creates nothing on the server: streams are topology, made once with
// EnsureStream or by the operator, never as a side effect of publishing.
// Call Close when done; the connection stays the caller's to close.
func New(js jetstream.JetStream, cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, errors.New("postboxnats: New needs a JetStream")
	}
	nc := js.Conn()
	if nc == nil {
		return nil, errors.New("postboxnats: the JetStream has no connection")
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		cfg:      c,
		slots:    make(chan struct{}, c.MaxPending),
		closing:  make(chan struct{}),
		ctx:      ctx,
		cancel:   cancel,
		inflight: make(map[*nats.Msg]*flight, c.MaxPending),
		lookups:  map[string][]waiter{},
	}
	// Ack and error handlers are per JetStream context, so the Publisher
	// makes its own on the same connection rather than take over the
	// caller's. Its pending limit equals the window, which p.slots
	// enforces first, so the client never stalls on it.
	o := js.Options()
	opts := []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncAckHandler(p.acked),
		jetstream.WithPublishAsyncErrHandler(p.failed),
		jetstream.WithPublishAsyncMaxPending(c.MaxPending),
		jetstream.WithPublishAsyncTimeout(c.PublishTimeout),
	}
	if o.DefaultTimeout > 0 {
		opts = append(opts, jetstream.WithDefaultTimeout(o.DefaultTimeout))
	}
	if o.ClientTrace != nil {
		opts = append(opts, jetstream.WithClientTrace(o.ClientTrace))
	}
	var err error
	switch {
	case o.Domain != "":
		p.js, err = jetstream.NewWithDomain(nc, o.Domain, opts...)
	case o.APIPrefix != "":
		p.js, err = jetstream.NewWithAPIPrefix(nc, o.APIPrefix, opts...)
	default:
		p.js, err = jetstream.New(nc, opts...)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("postboxnats: %w", err)
	}
	return p, nil
}

// Config returns the publisher's configuration, defaults filled in.
func (p *Publisher) Config() Config { return *p.cfg }

// Subject returns the subject topic is published on, or an error wrapping
// ErrInvalidSubject.
func (p *Publisher) Subject(topic string) (string, error) {
	var s string
	if p.cfg.Subject != nil {
		s = p.cfg.Subject(topic)
	} else {
		s = p.cfg.SubjectPrefix + topic
	}
	if err := validateSubject(s); err != nil {
		return "", fmt.Errorf("topic %q: %w", brokerutil.Shorten(topic), err)
	}
	return s, nil
}

// Pending returns the number of publishes the broker has not yet settled,
// including those whose done was already called because their context
// ended: each holds a slot of the MaxPending window until it resolves.
func (p *Publisher) Pending() int { return len(p.slots) }

// Publish sends env to the subject its topic maps to, with Nats-Msg-Id set
// to env.ID and env.Headers as NATS headers, and returns once the message
// is handed to the connection. done is called exactly once:
//
//   - nil when JetStream acknowledged the message, a duplicate included
//     (a message with that id was stored before);
//   - a postbox.MessageError when the message itself was refused (see
//     Classify; ErrNoStream only after the server confirmed that no stream
//     captures the subject);
//   - ctx.Err() when ctx ends first;
//   - any other error for an infrastructure failure.
//
// done runs on the caller's goroutine (an invalid message, a context that
// has ended) or on a goroutine of the NATS client, so it must not block.
// Publish may be called from several goroutines at once (the relay's
// lanes); it blocks while MaxPending publishes are unsettled, until ctx
// ends.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	if err := ctx.Err(); err != nil {
		done(err)
		return
	}
	m, err := p.message(env)
	if err != nil {
		done(postbox.NewMessageError(err))
		return
	}
	if err := brokerutil.Acquire(ctx, p.slots, p.closing, ErrClosed); err != nil {
		done(err)
		return
	}
	f := &flight{id: env.ID, subject: m.Subject, done: done}
	f.stop = context.AfterFunc(ctx, func() { f.finish(ctx.Err()) })

	p.gate.RLock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.gate.RUnlock()
		<-p.slots
		f.stop()
		f.finish(ErrClosed)
		return
	}
	// Registered before the send: the ack can arrive before
	// PublishMsgAsync returns.
	p.inflight[m] = f
	p.mu.Unlock()
	_, err = p.js.PublishMsgAsync(m)
	p.gate.RUnlock()
	if err != nil {
		// The client failed the send itself (payload over max_payload,
		// connection closed, reconnect buffer full) and calls no handler
		// for it, unless a reconnect failed the publish first; take
		// settles whichever came first.
		if f := p.take(m); f != nil {
			p.resolve(f, err)
		}
	}
}

// message builds the NATS message for env. The id travels as Nats-Msg-Id,
// exactly what jetstream.WithMsgID sets; setting the header directly
// spares the options' allocations on every publish.
func (p *Publisher) message(env *postbox.Envelope) (*nats.Msg, error) {
	if env.ID == "" {
		return nil, ErrNoID
	}
	subject, err := p.Subject(env.Topic)
	if err != nil {
		return nil, err
	}
	if err := validateHeaderValue(jetstream.MsgIDHeader, env.ID); err != nil {
		return nil, err
	}
	n := len(env.Headers) + 2
	h := make(nats.Header, n)
	// One backing array for every header's one-element value slice.
	vals := make([]string, 0, n)
	set := func(k, v string) {
		vals = append(vals, v)
		i := len(vals)
		h[k] = vals[i-1 : i : i]
	}
	for k, v := range env.Headers {
		if err := validateHeader(k, v); err != nil {
			return nil, err
		}
		set(k, v)
	}
	set(jetstream.MsgIDHeader, env.ID)
	if p.cfg.ExpectStream != "" {
		set(jetstream.ExpectedStreamHeader, p.cfg.ExpectStream)
	}
	return &nats.Msg{Subject: subject, Data: env.Payload, Header: h}, nil
}

// take removes m's flight and frees its slot; nil when another path
// settled it first.
func (p *Publisher) take(m *nats.Msg) *flight {
	p.mu.Lock()
	f := p.inflight[m]
	delete(p.inflight, m)
	p.mu.Unlock()
	if f != nil {
		<-p.slots
	}
	return f
}

// acked is the client's ack handler, run on its reply dispatch goroutine.
func (p *Publisher) acked(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
	if f := p.take(m); f != nil {
		f.stop()
		f.finish(nil)
	}
}

// failed is the client's error handler. It runs on the reply dispatch
// goroutine (an error in the PubAck, no responders), the reconnect
// watcher (nats.ErrDisconnected for everything in flight), Close's
// goroutine (CleanupPublisher), or a timer goroutine
// (jetstream.ErrAsyncPublishTimeout), which holds the client's publisher
// lock while it calls us.
func (p *Publisher) failed(_ jetstream.JetStream, m *nats.Msg, err error) {
	f := p.take(m)
	if f == nil {
		return
	}
	if errors.Is(err, jetstream.ErrJetStreamPublisherClosed) {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		// A done that published again from here would deadlock on the
		// lock the timer holds; hand the outcome to a goroutine of our
		// own. Timeouts come only when the broker is in trouble, so
		// these are few.
		p.mu.Lock()
		if !p.closed {
			p.wg.Add(1)
			p.mu.Unlock()
			go func() {
				defer p.wg.Done()
				p.resolve(f, err)
			}()
			return
		}
		p.mu.Unlock()
	}
	p.resolve(f, err)
}

// resolve reports a failed publish, classified.
func (p *Publisher) resolve(f *flight, err error) {
	f.stop()
	switch Classify(err) {
	case Message:
		f.finish(postbox.NewMessageError(fmt.Errorf("postboxnats: publish %s on %q: %w", f.id, f.subject, err)))
	case Unconfirmed:
		p.confirm(f, err)
	default:
		f.finish(fmt.Errorf("postboxnats: publish %s on %q: %w", f.id, f.subject, err))
	}
}

// confirm settles a publish nothing answered by asking the server which
// stream captures its subject. Publishes to one subject share a lookup:
// a missing stream fails a whole window of them at once.
func (p *Publisher) confirm(f *flight, cause error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		f.finish(fmt.Errorf("postboxnats: publish %s on %q: %w (%w)", f.id, f.subject, cause, ErrClosed))
		return
	}
	ws, running := p.lookups[f.subject]
	p.lookups[f.subject] = append(ws, waiter{f, cause})
	if !running {
		p.wg.Add(1)
		go p.lookup(f.subject)
	}
	p.mu.Unlock()
}

func (p *Publisher) lookup(subject string) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.PublishTimeout)
	stream, err := p.js.StreamNameBySubject(ctx, subject)
	cancel()
	p.mu.Lock()
	ws := p.lookups[subject]
	delete(p.lookups, subject)
	p.mu.Unlock()
	for _, w := range ws {
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			w.f.finish(postbox.NewMessageError(fmt.Errorf("postboxnats: publish %s: %w: %q (%w)", w.f.id, ErrNoStream, subject, w.cause)))
		case err != nil:
			// JetStream not ready, disconnected, lookup timed out: the
			// server could not say, so the message is not to blame.
			w.f.finish(fmt.Errorf("postboxnats: publish %s on %q: %w (stream lookup failed: %w)", w.f.id, subject, w.cause, err))
		default:
			w.f.finish(fmt.Errorf("postboxnats: publish %s on %q: stream %q did not answer: %w", w.f.id, subject, stream, w.cause))
		}
	}
}

// Close stops the publisher: publishes still awaiting their ack fail with
// an error wrapping ErrClosed (an infrastructure failure: the relay
// publishes them again), and every later Publish fails with ErrClosed.
// It waits, until ctx ends, for the publisher's goroutines (stream
// lookups) to exit. The connection is left open. Calling Close again
// does nothing.
func (p *Publisher) Close(ctx context.Context) error {
	p.gate.Lock()
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if !already {
		close(p.closing)
	}
	p.gate.Unlock()
	if already {
		return nil
	}
	// Fails everything in flight through p.failed, unsubscribes the reply
	// subject and stops the client's reconnect watcher.
	p.js.CleanupPublisher()
	p.cancel()
	waited := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("postboxnats: close: %w", ctx.Err())
	}
	p.mu.Lock()
	left := p.inflight
	p.inflight = map[*nats.Msg]*flight{}
	p.mu.Unlock()
	for _, f := range left {
		f.stop()
		f.finish(ErrClosed)
	}
	return nil
}

var _ postbox.Publisher = (*Publisher)(nil)
