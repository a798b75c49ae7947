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
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Publisher publishes envelopes to JetStream and reports each one done on
// its PubAck. It implements postbox.Publisher; its methods are safe for
// concurrent use.
//
// Acks are awaited without a goroutine per message: the Publisher owns a
// JetStream context of its own on the caller's connection, whose ack and
// error handlers look the message up and call its done. A publish costs a
// map entry, the client's own ack timer, and a place in the one watch of
// its context that the publishes of that context share.
type Publisher struct {
	cfg *Config
	js  jetstream.JetStream
	// kit holds the MaxPending window (a slot per publish the broker has
	// not settled) and keeps Close out while a Publish is inside the
	// client: after CleanupPublisher, a late PublishMsgAsync would
	// resubscribe the reply subject and nothing would ever clean it up
	// again. Its goroutines are the stream lookups and timeout hand-offs,
	// and its context ends the lookups at Close.
	kit *pubkit.Kit

	mu       sync.Mutex
	inflight map[*nats.Msg]*flight // sent, awaiting the broker's answer
	lookups  map[string][]waiter   // subject -> publishes awaiting a stream lookup

	// subjects holds the valid subjects of up to maxSubjects topics,
	// topic -> subject, where they are SubjectPrefix+topic: a relay
	// publishes few topics many times, and the subject need not be
	// joined and checked again each time.
	subjects  sync.Map
	nsubjects atomic.Int32
}

// maxSubjects bounds the subjects a Publisher keeps: past it, a topic's
// subject is joined and checked at each publish.
const maxSubjects = 4096

// flight is one publish awaiting its outcome. Its slot is freed when the
// client hands the broker's answer back (take), before the outcome is
// classified, which may take a stream lookup.
type flight struct {
	pubkit.Flight
	id      string
	subject string
	// msg is what is sent; &msg is the flight's key in inflight, and the
	// message the client hands back with the outcome. Held here, it costs
	// no allocation of its own.
	msg nats.Msg
	// vals backs the one-element value slices of msg's headers when they
	// fit, as a relay's envelope does (its CloudEvents attributes, the
	// replay horizon and Nats-Msg-Id): one allocation fewer a publish.
	vals [flightHeaders]string
}

// flightHeaders is how many headers a flight holds without a slice of
// their values of its own.
const flightHeaders = 10

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
	p := &Publisher{
		cfg:      c,
		kit:      pubkit.New(c.MaxPending, ErrClosed),
		inflight: make(map[*nats.Msg]*flight, c.MaxPending),
		lookups:  map[string][]waiter{},
	}
	// Ack and error handlers are per JetStream context, so the Publisher
	// makes its own on the same connection rather than take over the
	// caller's. Its pending limit equals the window, which p.kit
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
		p.kit.Cancel()
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
		if s, ok := p.subjects.Load(topic); ok {
			return s.(string), nil
		}
		s = p.cfg.SubjectPrefix + topic
	}
	if err := validateSubject(s); err != nil {
		return "", fmt.Errorf("topic %q: %w", configcheck.Shorten(topic), err)
	}
	// A Subject function is the caller's, and need not give the same
	// subject twice: its subjects are not kept.
	if p.cfg.Subject == nil && p.nsubjects.Load() < maxSubjects && p.nsubjects.Add(1) <= maxSubjects {
		p.subjects.Store(topic, s)
	}
	return s, nil
}

// Pending returns the number of publishes the broker has not yet settled,
// including those whose done was already called because their context
// ended: each holds a slot of the MaxPending window until it resolves.
func (p *Publisher) Pending() int { return p.kit.Window().Pending() }

// Publish sends env to the subject its topic maps to, with Nats-Msg-Id set
// to env.ID and env.Headers as NATS headers, and returns once the message
// is handed to the connection. done is called exactly once:
//
//   - nil when JetStream acknowledged the message, a duplicate included
//     (a message with that id was stored before);
//   - a postbox.MessageError when the message itself was refused (see
//     the package's table of failures; ErrNoStream only after the server
//     confirmed that no stream captures the subject);
//   - ctx.Err() when ctx ends first;
//   - any other error for an infrastructure failure.
//
// done runs on the caller's goroutine (an invalid message, a context that
// has ended) or on a goroutine of the NATS client, so it must not block.
// Publish may be called from several goroutines at once (the relay's
// lanes); it blocks while MaxPending publishes are unsettled, until ctx
// ends.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	f, ok := pubkit.Start(p.kit, ctx, env, done, p.flight)
	if !ok {
		return
	}
	// Registered before the send: the ack can arrive before
	// PublishMsgAsync returns.
	p.mu.Lock()
	p.inflight[&f.msg] = f
	p.mu.Unlock()
	_, err := p.js.PublishMsgAsync(&f.msg)
	p.kit.Leave()
	if err != nil {
		// The client failed the send itself (payload over max_payload,
		// connection closed, reconnect buffer full) and calls no handler
		// for it, unless a reconnect failed the publish first; take
		// settles whichever came first.
		if f := p.take(&f.msg); f != nil {
			p.resolve(f, err)
		}
	}
}

// CheckMessage implements postbox.MessageChecker: what Publish could
// never send is refused when the message is written. It encodes env as
// Publish does, so a topic whose subject is invalid (an empty token, as in
// "a..b", ".a" or "a."; a wildcard; a server namespace), a header NATS
// cannot carry or that steers JetStream, and a key with CR, LF or NUL
// (it travels in the ce-partitionkey header) are refused; and, once the
// connection knows the server's max_payload, a payload that with its
// headers is over it (nats.ErrMaxPayload).
func (p *Publisher) CheckMessage(env *postbox.Envelope) error {
	f, err := p.flight(env)
	if err != nil {
		return err
	}
	if most := p.js.Conn().MaxPayload(); most > 0 {
		// What the client counts against max_payload: headers and data.
		if size := int64(f.msg.Size() - len(f.msg.Subject) - len(f.msg.Reply)); size > most {
			return fmt.Errorf("%w: payload and headers take %d bytes, over the server's max_payload of %d", nats.ErrMaxPayload, size, most)
		}
	}
	return nil
}

// flight builds the NATS message for env. The id travels as Nats-Msg-Id,
// exactly what jetstream.WithMsgID sets; setting the header directly
// spares the options' allocations on every publish.
func (p *Publisher) flight(env *postbox.Envelope) (*flight, error) {
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
	// Exactly the headers sent: a map made for one more may take a table
	// twice the size.
	n := len(env.Headers) + 1
	if p.cfg.ExpectStream != "" {
		n++
	}
	h := make(nats.Header, n)
	f := &flight{id: env.ID, subject: subject}
	// One backing array for every header's one-element value slice.
	vals := f.vals[:0]
	if n > len(f.vals) {
		vals = make([]string, 0, n)
	}
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
	f.msg = nats.Msg{Subject: subject, Data: env.Payload, Header: h}
	return f, nil
}

// take removes m's flight and frees its slot; nil when another path
// settled it first.
func (p *Publisher) take(m *nats.Msg) *flight {
	p.mu.Lock()
	f := p.inflight[m]
	delete(p.inflight, m)
	p.mu.Unlock()
	if f != nil {
		f.Release()
	}
	return f
}

// acked is the client's ack handler, run on its reply dispatch goroutine.
func (p *Publisher) acked(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
	if f := p.take(m); f != nil {
		f.Settle(nil)
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
		// these are few. Once closed, no goroutine is started, and none
		// is needed: Close's CleanupPublisher calls us holding no lock.
		if p.kit.Go(func() { p.resolve(f, err) }) {
			return
		}
	}
	p.resolve(f, err)
}

// resolve reports a failed publish, classified.
func (p *Publisher) resolve(f *flight, err error) {
	f.Stop()
	switch classify(err) {
	case pubkit.Permanent:
		f.Finish(postbox.Permanent(fmt.Errorf("postboxnats: publish %s on %q: %w", f.id, f.subject, err)))
	case pubkit.Message:
		f.Finish(postbox.NewMessageError(fmt.Errorf("postboxnats: publish %s on %q: %w", f.id, f.subject, err)))
	case pubkit.Unconfirmed:
		p.confirm(f, err)
	default:
		f.Finish(fmt.Errorf("postboxnats: publish %s on %q: %w", f.id, f.subject, err))
	}
}

// confirm settles a publish nothing answered by asking the server which
// stream captures its subject. Publishes to one subject share a lookup:
// a missing stream fails a whole window of them at once.
func (p *Publisher) confirm(f *flight, cause error) {
	p.mu.Lock()
	ws, running := p.lookups[f.subject]
	if p.kit.Closed() || !running && !p.kit.Go(func() { p.lookup(f.subject) }) {
		p.mu.Unlock()
		f.Finish(fmt.Errorf("postboxnats: publish %s on %q: %w (%w)", f.id, f.subject, cause, ErrClosed))
		return
	}
	// The lookup started above reads the waiters only once p.mu is free.
	p.lookups[f.subject] = append(ws, waiter{f, cause})
	p.mu.Unlock()
}

func (p *Publisher) lookup(subject string) {
	ctx, cancel := context.WithTimeout(p.kit.Context(), p.cfg.PublishTimeout)
	stream, err := p.js.StreamNameBySubject(ctx, subject)
	cancel()
	p.mu.Lock()
	ws := p.lookups[subject]
	delete(p.lookups, subject)
	p.mu.Unlock()
	for _, w := range ws {
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			w.f.Finish(postbox.NewMessageError(fmt.Errorf("postboxnats: publish %s: %w: %q (%w)", w.f.id, ErrNoStream, subject, w.cause)))
		case err != nil:
			// JetStream not ready, disconnected, lookup timed out: the
			// server could not say, so the message is not to blame.
			w.f.Finish(fmt.Errorf("postboxnats: publish %s on %q: %w (stream lookup failed: %w)", w.f.id, subject, w.cause, err))
		default:
			w.f.Finish(fmt.Errorf("postboxnats: publish %s on %q: stream %q did not answer: %w", w.f.id, subject, stream, w.cause))
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
	if !p.kit.Close() {
		return nil
	}
	// Fails everything in flight through p.failed, unsubscribes the reply
	// subject and stops the client's reconnect watcher.
	p.js.CleanupPublisher()
	p.kit.Cancel()
	if err := p.kit.Wait(ctx); err != nil {
		return fmt.Errorf("postboxnats: close: %w", err)
	}
	p.mu.Lock()
	left := p.inflight
	p.inflight = map[*nats.Msg]*flight{}
	p.mu.Unlock()
	for _, f := range left {
		f.Stop()
		f.Finish(ErrClosed)
	}
	return nil
}

var _ postbox.Publisher = (*Publisher)(nil)
