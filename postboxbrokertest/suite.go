// Package postboxbrokertest is the broker conformance suite: every
// publisher and subscriber (NATS JetStream, the in-memory broker of
// postboxtest, and the others as they come) runs it against its real
// broker, with a Features struct declaring what differs.
package postboxbrokertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// Harness tells the suite how to reach one broker.
type Harness struct {
	// New returns a broker destination no other test uses (a stream, a
	// queue), cleaned up when t ends.
	New func(t *testing.T) *Broker
	// Features declares what differs between brokers.
	Features Features
}

// Broker is one isolated destination.
type Broker struct {
	Publisher postbox.Publisher
	// Topic routes to the destination; the suite publishes only to it.
	Topic string
	// Subscriber makes a subscriber for consumer on the destination.
	Subscriber func(t *testing.T, consumer string, opts SubscriberOptions) postbox.Subscriber
	// Unroutable is a topic that routes nowhere, where the broker can tell
	// (Features.RejectsUnroutable).
	Unroutable string
	// Prepare, when set, is called with the consumer names a test will use
	// before it publishes anything: brokers where a consumer is a queue
	// declare it there, so that nothing published earlier is lost.
	Prepare func(t *testing.T, consumers ...string)
}

// prepare tells the broker which consumers a test is about to use.
func (b *Broker) prepare(t *testing.T, consumers ...string) {
	if b.Prepare != nil {
		b.Prepare(t, consumers...)
	}
}

// SubscriberOptions are the options every subscriber offers.
type SubscriberOptions struct {
	PerKey      bool // handle the deliveries of a key one at a time, in order
	MaxInFlight int  // 0: the adapter's default
}

// Features declares a broker's capabilities. A test that needs one runs
// only where it is declared, and says so when skipped.
type Features struct {
	// NativeDedupe: a second publish of an id within the broker's window is
	// dropped (JetStream's Nats-Msg-Id).
	NativeDedupe bool
	// DelayedRedelivery: a Retry verdict's delay is honoured, by the broker
	// or by the subscriber holding the delivery.
	DelayedRedelivery bool
	// OrderPerKey: the subscriber's PerKey option keeps per-key order.
	OrderPerKey bool
	// RejectsUnroutable: publishing to a topic that routes nowhere fails as
	// a message failure.
	RejectsUnroutable bool
	// PartitionBound: the subscriber processes one message of a partition
	// at a time, so the partitions it is assigned bound what it processes
	// at once, below an in-flight hint.
	PartitionBound bool
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("PublishAndConsume", func(t *testing.T) { publishAndConsume(t, h) })
	t.Run("CanceledPublishIsInfrastructure", func(t *testing.T) { canceledPublish(t, h) })
	t.Run("Dedupe", func(t *testing.T) { dedupe(t, h) })
	t.Run("RetryRedelivers", func(t *testing.T) { retryRedelivers(t, h) })
	t.Run("DeadLetteredIsAcked", func(t *testing.T) { deadLetteredIsAcked(t, h) })
	t.Run("PerKeyOrder", func(t *testing.T) { perKeyOrder(t, h) })
	t.Run("CompetingConsumers", func(t *testing.T) { competingConsumers(t, h) })
	t.Run("UnroutableIsMessageFailure", func(t *testing.T) { unroutable(t, h) })
	t.Run("InFlightHint", func(t *testing.T) { inFlightHint(t, h) })
}

func envelope(topic, key string, n int) *postbox.Envelope {
	id := postbox.NewID()
	h := map[string]string{
		postbox.HeaderSpecVersion: "1.0", postbox.HeaderID: id, postbox.HeaderType: topic,
		postbox.HeaderSource: "suite", postbox.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano),
		"tenant": "acme",
	}
	if key != "" {
		h[postbox.HeaderPartitionKey] = key
	}
	return &postbox.Envelope{ID: id, Topic: topic, Key: key, Payload: fmt.Appendf(nil, "%d", n), Headers: h, CreatedAt: time.Now(), Attempt: 1}
}

// publish publishes envs one key chain at a time as the relay would, and
// fails the test on any error.
func publish(t *testing.T, pub postbox.Publisher, envs ...*postbox.Envelope) {
	t.Helper()
	for _, env := range envs {
		if err := publishOne(context.Background(), pub, env); err != nil {
			t.Fatalf("publish %s: %v", env.ID, err)
		}
	}
}

func publishOne(ctx context.Context, pub postbox.Publisher, env *postbox.Envelope) error {
	ch := make(chan error, 1)
	pub.Publish(ctx, env, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("done not called within 30s")
	}
}

// recorder is a Processor that records deliveries and answers with
// verdict (nil: Ack).
type recorder struct {
	mu      sync.Mutex
	got     []*postbox.Delivery
	at      []time.Time
	verdict func(d *postbox.Delivery, n int) postbox.Verdict
	count   map[string]int
	changed chan struct{}
}

func newRecorder(verdict func(d *postbox.Delivery, n int) postbox.Verdict) *recorder {
	return &recorder{verdict: verdict, count: map[string]int{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) Process(_ context.Context, d *postbox.Delivery) postbox.Verdict {
	r.mu.Lock()
	r.got = append(r.got, d)
	r.at = append(r.at, time.Now())
	r.count[d.ID]++
	n := r.count[d.ID]
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	if r.verdict == nil {
		return postbox.Verdict{Action: postbox.Ack}
	}
	return r.verdict(d, n)
}

func (r *recorder) snapshot() ([]*postbox.Delivery, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*postbox.Delivery(nil), r.got...), append([]time.Time(nil), r.at...)
}

// waitFor waits until cond holds over the deliveries so far.
func (r *recorder) waitFor(t *testing.T, what string, cond func(got []*postbox.Delivery) bool) []*postbox.Delivery {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		got, _ := r.snapshot()
		if cond(got) {
			return got
		}
		select {
		case <-r.changed:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s (%d deliveries so far)", what, len(got))
		}
	}
}

// consume runs sub with p until the test ends.
func consume(t *testing.T, sub postbox.Subscriber, p postbox.Processor) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, p) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("subscriber Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("subscriber Run did not return after its context ended")
		}
	})
}

func distinct(got []*postbox.Delivery) map[string]*postbox.Delivery {
	out := map[string]*postbox.Delivery{}
	for _, d := range got {
		if out[d.ID] == nil {
			out[d.ID] = d
		}
	}
	return out
}

func publishAndConsume(t *testing.T, h Harness) {
	b := h.New(t)
	b.prepare(t, "c1", "c2")
	var envs []*postbox.Envelope
	for i := range 200 {
		key := ""
		if i%4 != 0 {
			key = fmt.Sprintf("k%d", i%20)
		}
		envs = append(envs, envelope(b.Topic, key, i))
	}
	publish(t, b.Publisher, envs...)
	rec := newRecorder(nil)
	consume(t, b.Subscriber(t, "c1", SubscriberOptions{}), rec)
	got := rec.waitFor(t, "200 messages", func(got []*postbox.Delivery) bool { return len(distinct(got)) == 200 })
	byID := distinct(got)
	for _, env := range envs {
		d := byID[env.ID]
		if d == nil {
			t.Fatalf("message %s not delivered", env.ID)
		}
		if d.Topic != env.Topic || d.Key != env.Key || string(d.Payload) != string(env.Payload) || d.Headers["tenant"] != "acme" ||
			d.Headers[postbox.HeaderID] != env.ID || d.Headers[postbox.HeaderSpecVersion] != "1.0" {
			t.Fatalf("delivery %+v does not match envelope %+v", d, env)
		}
	}
	// A second consumer gets every message too.
	rec2 := newRecorder(nil)
	consume(t, b.Subscriber(t, "c2", SubscriberOptions{}), rec2)
	rec2.waitFor(t, "200 messages at a second consumer", func(got []*postbox.Delivery) bool { return len(distinct(got)) == 200 })
}

func canceledPublish(t *testing.T, h Harness) {
	b := h.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := publishOne(ctx, b.Publisher, envelope(b.Topic, "", 0))
	if err == nil {
		t.Fatal("publish with a canceled context succeeded")
	}
	if postbox.IsMessageError(err) {
		t.Fatalf("canceled publish classified as a message failure: %v", err)
	}
}

func dedupe(t *testing.T, h Harness) {
	if !h.Features.NativeDedupe {
		t.Skip("broker declares no native dedupe")
	}
	b := h.New(t)
	b.prepare(t, "c")
	env := envelope(b.Topic, "k", 0)
	publish(t, b.Publisher, env, env)
	sentinel := envelope(b.Topic, "k", 1)
	publish(t, b.Publisher, sentinel)
	rec := newRecorder(nil)
	consume(t, b.Subscriber(t, "c", SubscriberOptions{PerKey: h.Features.OrderPerKey}), rec)
	got := rec.waitFor(t, "the sentinel", func(got []*postbox.Delivery) bool { return distinct(got)[sentinel.ID] != nil })
	n := 0
	for _, d := range got {
		if d.ID == env.ID {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("a message published twice under one id was delivered %d times", n)
	}
}

func retryRedelivers(t *testing.T, h Harness) {
	b := h.New(t)
	b.prepare(t, "c")
	const delay = 200 * time.Millisecond
	env := envelope(b.Topic, "", 0)
	publish(t, b.Publisher, env)
	rec := newRecorder(func(_ *postbox.Delivery, n int) postbox.Verdict {
		if n == 1 {
			return postbox.Verdict{Action: postbox.Retry, Delay: delay}
		}
		return postbox.Verdict{Action: postbox.Ack}
	})
	consume(t, b.Subscriber(t, "c", SubscriberOptions{}), rec)
	rec.waitFor(t, "a redelivery", func(got []*postbox.Delivery) bool { return len(got) >= 2 })
	got, at := rec.snapshot()
	if got[1].ID != env.ID {
		t.Fatalf("redelivered %s, want %s", got[1].ID, env.ID)
	}
	// Some brokers count only some deliveries (RabbitMQ's classic queues
	// count none after the first): compare only when both are known.
	if got[0].Delivered != 0 && got[1].Delivered != 0 && got[1].Delivered != got[0].Delivered+1 {
		t.Fatalf("delivery counts %d then %d", got[0].Delivered, got[1].Delivered)
	}
	if h.Features.DelayedRedelivery && at[1].Sub(at[0]) < delay {
		t.Fatalf("redelivered after %s, before the %s delay", at[1].Sub(at[0]), delay)
	}
}

func deadLetteredIsAcked(t *testing.T, h Harness) {
	b := h.New(t)
	b.prepare(t, "c")
	env := envelope(b.Topic, "", 0)
	publish(t, b.Publisher, env)
	rec := newRecorder(func(d *postbox.Delivery, _ int) postbox.Verdict {
		if d.ID == env.ID {
			return postbox.Verdict{Action: postbox.DeadLettered}
		}
		return postbox.Verdict{Action: postbox.Ack}
	})
	consume(t, b.Subscriber(t, "c", SubscriberOptions{}), rec)
	rec.waitFor(t, "the delivery", func(got []*postbox.Delivery) bool { return len(got) >= 1 })
	// An absence cannot be awaited: give a wrongful redelivery a quiet
	// period to show, then check that a message published later arrives
	// and the dead-lettered one did not come back.
	time.Sleep(300 * time.Millisecond)
	sentinel := envelope(b.Topic, "", 1)
	publish(t, b.Publisher, sentinel)
	got := rec.waitFor(t, "the sentinel", func(got []*postbox.Delivery) bool { return distinct(got)[sentinel.ID] != nil })
	for _, d := range got {
		if d.ID == env.ID && d != got[0] {
			t.Fatal("a dead-lettered delivery was redelivered")
		}
	}
}

// With PerKey, a key's messages are handled one at a time and in order,
// even when some of them are retried.
func perKeyOrder(t *testing.T, h Harness) {
	if !h.Features.OrderPerKey {
		t.Skip("subscriber declares no per-key order")
	}
	b := h.New(t)
	const keys, per = 8, 15
	b.prepare(t, "c")
	var envs []*postbox.Envelope
	for i := range per {
		for k := range keys {
			envs = append(envs, envelope(b.Topic, fmt.Sprintf("k%d", k), i))
		}
	}
	publish(t, b.Publisher, envs...)
	var mu sync.Mutex
	active := map[string]bool{}
	next := map[string]int{}
	var violation string
	rec := newRecorder(func(d *postbox.Delivery, n int) postbox.Verdict {
		mu.Lock()
		if active[d.Key] && violation == "" {
			violation = "two deliveries of key " + d.Key + " at once"
		}
		active[d.Key] = true
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) //nolint:gosec // jitter
		mu.Lock()
		defer mu.Unlock()
		active[d.Key] = false
		if n == 1 && rand.IntN(5) == 0 { //nolint:gosec // some first deliveries fail
			return postbox.Verdict{Action: postbox.Retry, Delay: 10 * time.Millisecond}
		}
		var seq int
		_, _ = fmt.Sscanf(string(d.Payload), "%d", &seq)
		if seq != next[d.Key] && violation == "" {
			violation = fmt.Sprintf("key %s: message %d handled when %d was due", d.Key, seq, next[d.Key])
		}
		next[d.Key] = seq + 1
		return postbox.Verdict{Action: postbox.Ack}
	})
	consume(t, b.Subscriber(t, "c", SubscriberOptions{PerKey: true, MaxInFlight: 8}), rec)
	rec.waitFor(t, "every key handled to the end", func([]*postbox.Delivery) bool {
		mu.Lock()
		defer mu.Unlock()
		for k := range keys {
			if next[fmt.Sprintf("k%d", k)] != per {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
}

func competingConsumers(t *testing.T, h Harness) {
	b := h.New(t)
	b.prepare(t, "shared")
	var envs []*postbox.Envelope
	for i := range 100 {
		envs = append(envs, envelope(b.Topic, "", i))
	}
	publish(t, b.Publisher, envs...)
	rec := newRecorder(nil)
	consume(t, b.Subscriber(t, "shared", SubscriberOptions{}), rec)
	consume(t, b.Subscriber(t, "shared", SubscriberOptions{}), rec)
	got := rec.waitFor(t, "100 messages across two subscribers", func(got []*postbox.Delivery) bool { return len(distinct(got)) == 100 })
	if len(got) != 100 {
		t.Fatalf("%d deliveries for 100 messages acknowledged at once: subscribers of one consumer must share", len(got))
	}
}

func unroutable(t *testing.T, h Harness) {
	if !h.Features.RejectsUnroutable {
		t.Skip("broker declares it cannot tell an unroutable message")
	}
	b := h.New(t)
	err := publishOne(context.Background(), b.Publisher, envelope(b.Unroutable, "", 0))
	if err == nil || !postbox.IsMessageError(err) {
		t.Fatalf("publish to an unroutable topic: %v, want a message failure", err)
	}
}

// hinting is a Processor that asks for hint deliveries in flight at once
// (postbox.InFlightHinter) and holds each delivery until that many are
// being processed together, or for at most hold.
type hinting struct {
	hint int
	hold time.Duration

	mu        sync.Mutex
	now, peak int
	seen      map[string]bool
	full      chan struct{} // closed once hint deliveries were in at once
	changed   chan struct{}
}

func newHinting(hint int, hold time.Duration) *hinting {
	return &hinting{hint: hint, hold: hold, seen: map[string]bool{}, full: make(chan struct{}), changed: make(chan struct{}, 1)}
}

func (h *hinting) InFlightHint() int { return h.hint }

func (h *hinting) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	h.mu.Lock()
	h.now++
	if h.now > h.peak {
		h.peak = h.now
		if h.peak == h.hint {
			close(h.full)
		}
	}
	h.seen[d.ID] = true
	h.mu.Unlock()
	t := time.NewTimer(h.hold)
	select {
	case <-h.full:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	h.mu.Lock()
	h.now--
	h.mu.Unlock()
	select {
	case h.changed <- struct{}{}:
	default:
	}
	return postbox.Verdict{Action: postbox.Ack}
}

// state returns the most deliveries processed at once so far, and how
// many distinct messages were seen.
func (h *hinting) state() (peak, seen int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, len(h.seen)
}

// inFlightHint checks that a subscriber left at its default in-flight
// bound takes a larger one its Processor asks for (Inbox.BatchProcessor
// does, for its batches to fill), and that a bound set in its options
// is kept.
func inFlightHint(t *testing.T, h Harness) {
	// Above every adapter's default bound.
	const hint = 100
	b := h.New(t)
	b.prepare(t, "c1", "c2")
	envs := make([]*postbox.Envelope, hint)
	for i := range envs {
		envs[i] = envelope(b.Topic, fmt.Sprintf("k%d", i), i)
	}
	publish(t, b.Publisher, envs...)

	if h.Features.PartitionBound {
		t.Log("the subscriber processes one message of a partition at a time: only a bound set is checked")
	} else {
		auto := newHinting(hint, time.Minute)
		consume(t, b.Subscriber(t, "c1", SubscriberOptions{}), auto)
		select {
		case <-auto.full:
		case <-time.After(30 * time.Second):
			peak, seen := auto.state()
			t.Fatalf("at most %d deliveries were processed at once (%d seen), want the hint, %d", peak, seen, hint)
		}
	}

	const bound = 8
	set := newHinting(hint, 20*time.Millisecond)
	consume(t, b.Subscriber(t, "c2", SubscriberOptions{MaxInFlight: bound}), set)
	deadline := time.After(30 * time.Second)
	for {
		peak, seen := set.state()
		if peak > bound {
			t.Fatalf("%d deliveries were processed at once, with MaxInFlight %d", peak, bound)
		}
		if seen == hint {
			break
		}
		select {
		case <-set.changed:
		case <-deadline:
			t.Fatalf("timed out: %d of %d messages seen with MaxInFlight %d", seen, hint, bound)
		}
	}
}
