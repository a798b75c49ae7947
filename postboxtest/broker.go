// Package postboxtest holds test aids for applications that use postbox:
// an in-memory broker (a Publisher and Subscribers) that passes the same
// broker conformance suite as the real adapters, with switches to make it
// fail, and examples of Client.Drain, which runs the relay synchronously.
package postboxtest

import (
	"context"
	"errors"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/postbox-go/postbox"
)

// ErrBrokerDown is the infrastructure failure the broker returns while
// SetDown(true) is in effect.
var ErrBrokerDown = errors.New("postboxtest: broker down")

// Broker is an in-memory broker: one stream of messages, consumed by named
// consumer groups. Safe for concurrent use.
type Broker struct {
	mu      sync.Mutex
	window  time.Duration
	seen    map[string]time.Time // message id -> stored at, for dedupe
	stream  []*postbox.Envelope
	copies  int
	groups  map[string]*group
	down    bool
	reject  func(*postbox.Envelope) error
	changed chan struct{} // closed and replaced on every change
}

// BrokerOptions configure a Broker.
type BrokerOptions struct {
	// DedupeWindow drops a publish whose id was stored within the window,
	// as JetStream's Nats-Msg-Id does. Default 2 minutes; negative disables.
	DedupeWindow time.Duration
}

// NewBroker returns an empty broker. opts may be nil.
func NewBroker(opts *BrokerOptions) *Broker {
	w := 2 * time.Minute
	if opts != nil && opts.DedupeWindow != 0 {
		w = opts.DedupeWindow
	}
	return &Broker{window: w, seen: map[string]time.Time{}, groups: map[string]*group{}, changed: make(chan struct{})}
}

// SetDown makes every publish fail as an infrastructure failure while down
// is true, as an unreachable broker does.
func (b *Broker) SetDown(down bool) {
	b.mu.Lock()
	b.down = down
	b.mu.Unlock()
}

// Reject installs a predicate: a publish for which it returns an error
// fails as a message failure (postbox.NewMessageError). nil removes it.
func (b *Broker) Reject(fn func(*postbox.Envelope) error) {
	b.mu.Lock()
	b.reject = fn
	b.mu.Unlock()
}

// Publish implements postbox.Publisher.
func (b *Broker) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	if err := ctx.Err(); err != nil {
		done(err)
		return
	}
	b.mu.Lock()
	if b.down {
		b.mu.Unlock()
		done(ErrBrokerDown)
		return
	}
	if b.reject != nil {
		if err := b.reject(env); err != nil {
			b.mu.Unlock()
			done(postbox.NewMessageError(err))
			return
		}
	}
	b.copies++
	now := time.Now()
	if at, ok := b.seen[env.ID]; ok && b.window > 0 && now.Sub(at) < b.window {
		b.mu.Unlock()
		done(nil) // a copy within the window: acknowledged, not stored
		return
	}
	b.seen[env.ID] = now
	cp := *env
	cp.Headers = maps.Clone(env.Headers)
	cp.Payload = append([]byte(nil), env.Payload...)
	b.stream = append(b.stream, &cp)
	b.signal()
	b.mu.Unlock()
	done(nil)
}

// signal wakes every waiter; b.mu must be held.
func (b *Broker) signal() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Messages returns the stored messages, in the order stored.
func (b *Broker) Messages() []*postbox.Envelope {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*postbox.Envelope(nil), b.stream...)
}

// Publishes counts every acknowledged publish, copies dropped by the
// dedupe window included.
func (b *Broker) Publishes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.copies
}

// The subscriber's default and largest in-flight bound.
const (
	defaultMaxInFlight = 16
	maxMaxInFlight     = 4096
)

// SubscriberOptions configure a Subscriber.
type SubscriberOptions struct {
	// MaxInFlight bounds deliveries being processed at once. Default 16,
	// or, when Run's Processor asks for more (a postbox.InFlightHinter,
	// as Inbox.BatchProcessor is), that many, at most 4096.
	MaxInFlight int
	// PerKey processes the deliveries of one key one at a time, in stream
	// order, a redelivery included: a later message of a key waits while an
	// earlier one is in flight or waiting to be redelivered.
	PerKey bool
}

// group is one consumer name's view of the stream, shared by all its
// subscribers (competing consumers).
type group struct {
	next      int                    // stream indexes below it are queued or delivered
	queued    []int                  // stream indexes never delivered, in order
	redeliver map[int]time.Time      // stream index -> due time
	inflight  map[int]bool           // stream index -> being processed
	delivered map[int]int            // stream index -> deliveries
	settled   map[int]postbox.Action // stream index -> final action
}

// Subscriber returns a subscriber for consumer. Subscribers of one
// consumer share its deliveries; each consumer gets every message.
func (b *Broker) Subscriber(consumer string, opts *SubscriberOptions) postbox.Subscriber {
	var o SubscriberOptions
	if opts != nil {
		o = *opts
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.groups[consumer] == nil {
		b.groups[consumer] = &group{redeliver: map[int]time.Time{}, inflight: map[int]bool{}, delivered: map[int]int{}, settled: map[int]postbox.Action{}}
	}
	return &subscriber{b: b, g: b.groups[consumer], opts: o}
}

// Settlement is one message a consumer settled for good.
type Settlement struct {
	ID     string
	Action postbox.Action // Ack or DeadLettered
}

// Settled returns what consumer settled for good, in stream order; a copy
// stored twice appears twice.
func (b *Broker) Settled(consumer string) []Settlement {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Settlement
	if g := b.groups[consumer]; g != nil {
		idx := make([]int, 0, len(g.settled))
		for i := range g.settled {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			out = append(out, Settlement{ID: b.stream[i].ID, Action: g.settled[i]})
		}
	}
	return out
}

type subscriber struct {
	b    *Broker
	g    *group
	opts SubscriberOptions
}

// Run implements postbox.Subscriber.
func (s *subscriber) Run(ctx context.Context, p postbox.Processor) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	window := s.opts.MaxInFlight
	if window <= 0 {
		window = postbox.InFlight(p, defaultMaxInFlight, maxMaxInFlight)
	}
	sem := make(chan struct{}, window)
	for {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		i, wait, changed := s.take()
		for i < 0 {
			if !sleep(ctx, changed, wait) {
				return nil
			}
			i, wait, changed = s.take()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.process(ctx, p, i)
		}()
	}
}

// take claims the next deliverable stream index: a redelivery that is due,
// else the next new message; with PerKey, nothing of a key that has an
// earlier message in flight or waiting. It returns -1 and how long to wait
// when nothing is ready.
func (s *subscriber) take() (int, time.Duration, <-chan struct{}) {
	b, g := s.b, s.g
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	blocked := map[string]bool{}
	if s.opts.PerKey {
		for i := range g.inflight {
			blocked[b.stream[i].Key] = true
		}
	}
	var wait time.Duration
	due := make([]int, 0, len(g.redeliver))
	for i := range g.redeliver {
		due = append(due, i)
	}
	sort.Ints(due)
	for _, i := range due {
		k := b.stream[i].Key
		if at := g.redeliver[i]; !now.Before(at) && (k == "" || !blocked[k]) {
			delete(g.redeliver, i)
			return s.claim(i), 0, nil
		} else if wait == 0 || at.Sub(now) < wait {
			wait = max(at.Sub(now), time.Millisecond)
		}
		if s.opts.PerKey {
			blocked[k] = true
		}
	}
	for ; g.next < len(b.stream); g.next++ {
		g.queued = append(g.queued, g.next)
	}
	for qi, i := range g.queued {
		k := b.stream[i].Key
		if s.opts.PerKey && k != "" && blocked[k] {
			continue
		}
		g.queued = append(g.queued[:qi], g.queued[qi+1:]...)
		return s.claim(i), 0, nil
	}
	return -1, wait, b.changed
}

func (s *subscriber) claim(i int) int {
	s.g.inflight[i] = true
	s.g.delivered[i]++
	return i
}

func (s *subscriber) process(ctx context.Context, p postbox.Processor, i int) {
	b, g := s.b, s.g
	b.mu.Lock()
	env := b.stream[i]
	d := &postbox.Delivery{ID: env.ID, Topic: env.Topic, Key: env.Key, Payload: env.Payload, Headers: maps.Clone(env.Headers), Delivered: g.delivered[i]}
	b.mu.Unlock()
	v := p.Process(ctx, d)
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(g.inflight, i)
	if v.Action == postbox.Retry {
		g.redeliver[i] = time.Now().Add(v.Delay)
	} else {
		g.settled[i] = v.Action
	}
	b.signal()
}

// sleep waits for a change, for wait (when positive), or for ctx; it
// reports false when ctx ended.
func sleep(ctx context.Context, changed <-chan struct{}, wait time.Duration) bool {
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-changed:
	case <-timer:
	case <-ctx.Done():
		return false
	}
	return true
}
