package postboxamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
)

// ErrConsumerCancelled means the broker cancelled the subscription (the
// queue was deleted, or its leader moved); the Subscriber reconnects.
var ErrConsumerCancelled = errors.New("postboxamqp: consumer cancelled by the broker")

// Subscriber consumes one queue with manual acknowledgements and hands
// each delivery to a postbox.Processor, usually Inbox.Processor. It
// implements postbox.Subscriber. Several Subscribers (in one process or
// many) may consume one queue: the broker shares its deliveries among
// them.
type Subscriber struct {
	dial  Dialer
	queue string
	cfg   *SubscriberConfig
	log   *slog.Logger
	// autoInFlight and autoPrefetch: MaxInFlight and Prefetch were left
	// at their defaults, so a Run takes its Processor's hint (window).
	autoInFlight, autoPrefetch bool
}

// NewSubscriber returns a Subscriber for queue over connections from
// dial. cfg may be nil for all defaults; an invalid one returns a
// *postbox.ConfigError naming every bad field. It declares nothing: the
// queue is topology (EnsureTopology).
func NewSubscriber(dial Dialer, queue string, cfg *SubscriberConfig) (*Subscriber, error) {
	c := cfg.WithDefaults()
	err := c.Validate()
	if qerr := validateName(queue); qerr != nil {
		var ps problems
		var ce *postbox.ConfigError
		if errors.As(err, &ce) {
			ps = ce.Problems
		}
		ps.Add("queue", queue, "%v", qerr)
		err = ps.Err()
	}
	if err != nil {
		return nil, err
	}
	if dial == nil {
		return nil, errors.New("postboxamqp: NewSubscriber needs a Dialer")
	}
	return &Subscriber{
		dial: dial, queue: queue, cfg: c, log: c.Logger,
		autoInFlight: cfg == nil || cfg.MaxInFlight == 0,
		autoPrefetch: cfg == nil || cfg.Prefetch == 0,
	}, nil
}

// window returns the MaxInFlight and the prefetch of a Run of p: the
// config's, or, where MaxInFlight was left at its default, raised to p's
// hint (postbox.InFlight), and the prefetch with it, keeping the
// defaults' room for held deliveries above the window, unless the
// prefetch was set, which then bounds the hint.
func (s *Subscriber) window(p postbox.Processor) (inFlight, prefetch int) {
	inFlight, prefetch = s.cfg.MaxInFlight, s.cfg.Prefetch
	if !s.autoInFlight {
		return inFlight, prefetch
	}
	inFlight = postbox.InFlight(p, inFlight, maxPrefetch)
	if s.autoPrefetch {
		// Held retries and deliveries waiting for their key take
		// places of the prefetch, not of the window.
		return inFlight, min(maxPrefetch, max(prefetch, inFlight+DefaultPrefetch-DefaultMaxInFlight))
	}
	return min(inFlight, prefetch), prefetch
}

// Config returns the subscriber's configuration, defaults filled in. A
// Run whose Processor asks for a larger in-flight window than a
// MaxInFlight left at its default holds that many (postbox.InFlight).
func (s *Subscriber) Config() SubscriberConfig { return *s.cfg }

// Run consumes the queue until ctx ends, then returns nil. It settles each
// delivery after p.Process returns, as the Verdict says:
//
//   - Ack: basic.ack.
//   - Retry: the delivery is held, unacknowledged, for Verdict.Delay
//     (at most MaxRetryHold), then requeued with basic.nack(requeue). The
//     broker redelivers it to any consumer of the queue.
//   - DeadLettered: basic.nack without requeue, after the inbox wrote its
//     own dead letter: the broker moves the message to the queue's
//     dead-letter exchange, if it has one, and drops it otherwise.
//
// When the connection or the channel is lost, Run waits for the
// deliveries being processed (their settlements fail, and the broker
// redelivers them), then dials again with backoff and resumes. It returns
// an error only when its first subscription fails in a way a retry cannot
// mend: the queue does not exist, access is refused, the credentials are
// wrong.
func (s *Subscriber) Run(ctx context.Context, p postbox.Processor) error {
	if p == nil {
		return errors.New("postboxamqp: Run needs a Processor")
	}
	consumed := false
	failures := 0
	for {
		started, err := s.consume(ctx, p)
		if ctx.Err() != nil {
			return nil
		}
		if started {
			consumed, failures = true, 0
		}
		if !consumed && permanent(err) {
			return fmt.Errorf("postboxamqp: consume queue %q: %w", s.queue, err)
		}
		failures++
		wait := backoff(failures, s.cfg.ReconnectBackoff, s.cfg.ReconnectBackoffMax)
		s.log.Warn("postboxamqp: consumer stopped; reconnecting", slog.String("queue", s.queue), slog.Duration("in", wait), slog.Any("error", err))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// permanent reports whether a failure to start consuming will not mend
// by itself. After a broker restart a durable queue can be briefly
// reported missing (404) while it recovers, so these end Run only before
// its first successful subscription.
func permanent(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Code {
	case amqp.NotFound, amqp.AccessRefused, amqp.ResourceLocked, amqp.PreconditionFailed, amqp.NotAllowed:
		return true
	}
	return false
}

// consume runs one subscription on a connection of its own. It reports
// whether the subscription started, and why it ended.
func (s *Subscriber) consume(ctx context.Context, p postbox.Processor) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	conn, err := s.dial(dctx)
	cancel()
	if err != nil {
		return false, err
	}
	defer closeConn(conn)
	inFlight, prefetch := s.window(p)
	// Setting up waits for the broker without a context.
	stop := context.AfterFunc(ctx, func() { closeConn(conn) })
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(prefetch, 0, false)
	}
	var closes chan *amqp.Error
	var cancels chan string
	var deliveries <-chan amqp.Delivery
	if err == nil {
		closes = ch.NotifyClose(make(chan *amqp.Error, 1))
		cancels = ch.NotifyCancel(make(chan string, 1))
		deliveries, err = ch.Consume(s.queue, "postbox-"+postbox.NewID(), false, false, false, false, nil)
	}
	stop()
	if err != nil {
		return false, err
	}

	w := &workers{
		s: s, p: p, ctx: ctx,
		sem:   make(chan struct{}, inFlight),
		lanes: map[string][]item{},
		held:  map[uint64]*time.Timer{},
	}
loop:
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				break loop
			}
			w.dispatch(d)
		case <-ctx.Done():
			break loop
		}
	}
	// Deliveries not yet handed out stay unacknowledged: closing the
	// connection returns them to the queue.
	w.stop()
	if ctx.Err() != nil {
		return true, nil
	}
	select {
	case e := <-closes:
		if e != nil {
			return true, e
		}
	default:
	}
	select {
	case tag := <-cancels:
		return true, fmt.Errorf("%w (consumer %s)", ErrConsumerCancelled, tag)
	default:
	}
	return true, errors.New("postboxamqp: deliveries ended")
}

// item is one delivery, as received and as handed to the Processor.
type item struct {
	d   amqp.Delivery
	del *postbox.Delivery
}

// workers processes the deliveries of one subscription.
type workers struct {
	s   *Subscriber
	p   postbox.Processor
	ctx context.Context
	sem chan struct{} // MaxInFlight
	run sync.WaitGroup

	mu      sync.Mutex
	lanes   map[string][]item      // PerKey: a key being processed -> its deliveries waiting
	held    map[uint64]*time.Timer // deliveries held for a Retry's delay, by delivery tag
	holding sync.WaitGroup         // hold timers that have not finished
	stopped bool
}

// dispatch starts processing d, or queues it behind its key's lane. It
// waits for a MaxInFlight slot until ctx ends.
func (w *workers) dispatch(d amqp.Delivery) {
	it := item{d: d, del: delivery(&d)}
	key := ""
	if w.s.cfg.PerKey {
		key = it.del.Key
	}
	if key != "" {
		w.mu.Lock()
		if q, busy := w.lanes[key]; busy {
			w.lanes[key] = append(q, it)
			w.mu.Unlock()
			return
		}
		w.lanes[key] = nil
		w.mu.Unlock()
	}
	select {
	case w.sem <- struct{}{}:
	case <-w.ctx.Done():
		return
	}
	w.run.Add(1)
	go func() {
		defer w.run.Done()
		defer func() { <-w.sem }()
		for {
			w.process(it)
			if key == "" {
				return
			}
			w.mu.Lock()
			q := w.lanes[key]
			if len(q) == 0 || w.ctx.Err() != nil {
				delete(w.lanes, key)
				w.mu.Unlock()
				return
			}
			it, w.lanes[key] = q[0], q[1:]
			w.mu.Unlock()
		}
	}()
}

// process runs the Processor on one delivery and settles it.
func (w *workers) process(it item) {
	v := w.p.Process(w.ctx, it.del)
	var err error
	switch v.Action {
	case postbox.Ack:
		err = it.d.Ack(false)
	case postbox.DeadLettered:
		err = it.d.Nack(false, false)
	default: // Retry, and any action this version does not know
		w.retry(it.d, v.Delay)
		return
	}
	if err != nil {
		w.s.log.Debug("postboxamqp: settle failed; the broker will redeliver", slog.String("id", it.del.ID), slog.Any("error", err))
	}
}

// retry holds d for delay (at most MaxRetryHold), then requeues it.
// RabbitMQ has no delayed redelivery of its own; holding keeps the
// delivery from every consumer until the delay has passed, at the cost
// of a prefetch slot.
func (w *workers) retry(d amqp.Delivery, delay time.Duration) {
	delay = min(delay, w.s.cfg.MaxRetryHold)
	if delay <= 0 {
		if err := d.Nack(false, true); err != nil {
			w.s.log.Debug("postboxamqp: requeue failed; the broker will redeliver", slog.Any("error", err))
		}
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return // the connection closes, which requeues d
	}
	tag := d.DeliveryTag
	w.holding.Add(1)
	w.held[tag] = time.AfterFunc(delay, func() {
		defer w.holding.Done()
		w.mu.Lock()
		_, ok := w.held[tag]
		delete(w.held, tag)
		w.mu.Unlock()
		if !ok {
			return
		}
		if err := d.Nack(false, true); err != nil {
			w.s.log.Debug("postboxamqp: requeue failed; the broker will redeliver", slog.Any("error", err))
		}
	})
}

// stop waits for the deliveries being processed, and cancels the holds:
// closing the connection afterwards requeues what they held.
func (w *workers) stop() {
	w.run.Wait()
	w.mu.Lock()
	w.stopped = true
	for tag, t := range w.held {
		if t.Stop() {
			w.holding.Done()
		}
		delete(w.held, tag)
	}
	w.mu.Unlock()
	w.holding.Wait()
}

var _ postbox.Subscriber = (*Subscriber)(nil)
