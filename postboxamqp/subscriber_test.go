package postboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxamqp"
)

// procFunc adapts a function to postbox.Processor.
type procFunc func(ctx context.Context, d *postbox.Delivery) postbox.Verdict

func (f procFunc) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict { return f(ctx, d) }

// running runs sub with p until the test ends, and checks that Run
// returns nil soon after its context ends.
func running(t *testing.T, sub *postboxamqp.Subscriber, p postbox.Processor) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, p) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func subscriber(t *testing.T, url, queue string, cfg *postboxamqp.SubscriberConfig) *postboxamqp.Subscriber {
	t.Helper()
	c := postboxamqp.SubscriberConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Logger = quiet
	if c.ReconnectBackoff == 0 {
		c.ReconnectBackoff, c.ReconnectBackoffMax = 10*time.Millisecond, 100*time.Millisecond
	}
	sub, err := postboxamqp.NewSubscriber(postboxamqp.URL(url), queue, &c)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// publishAll publishes envs and fails the test on any error.
func publishAll(t *testing.T, p *postboxamqp.Publisher, envs ...*postbox.Envelope) {
	t.Helper()
	rs := make([]*result, len(envs))
	for i, env := range envs {
		rs[i] = pubtest.NewResult(t)
		p.Publish(context.Background(), env, rs[i].Done)
	}
	for i, r := range rs {
		if err := r.Wait(20 * time.Second); err != nil {
			t.Fatalf("publish %s: %v", envs[i].ID, err)
		}
	}
}

// deliveries is a channel of what a Processor received.
func collect(n int) (chan *postbox.Delivery, procFunc) {
	ch := make(chan *postbox.Delivery, n)
	return ch, func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		ch <- d
		return postbox.Verdict{Action: postbox.Ack}
	}
}

func receive(t *testing.T, ch chan *postbox.Delivery, n int) []*postbox.Delivery {
	t.Helper()
	var got []*postbox.Delivery
	for len(got) < n {
		select {
		case d := <-ch:
			got = append(got, d)
		case <-time.After(20 * time.Second):
			t.Fatalf("received %d of %d deliveries", len(got), n)
		}
	}
	return got
}

// A delivery carries what the Publisher sent, mapped back to postbox's
// header names.
func TestDeliveryFields(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	env := envelope("orders.created", "payload")
	env.Key = "order-1"
	env.Headers[postbox.HeaderPartitionKey] = "order-1"
	env.Headers[postbox.HeaderContentType] = "text/plain"
	env.Headers["tenant"] = "acme"
	publishAll(t, p, env)
	ch, proc := collect(1)
	running(t, subscriber(t, url, x+".q", nil), proc)
	d := receive(t, ch, 1)[0]
	want := map[string]string{}
	for k, v := range env.Headers {
		want[k] = v
	}
	if d.ID != env.ID || d.Topic != env.Topic || d.Key != "order-1" || string(d.Payload) != "payload" || d.Delivered != 1 ||
		fmt.Sprint(d.Headers) != fmt.Sprint(want) {
		t.Fatalf("delivery %+v, want the envelope %+v", d, env)
	}
}

// DeadLettered rejects the delivery without requeue: the broker moves it
// to the queue's dead-letter exchange.
func TestDeadLetteredGoesToTheDeadLetterExchange(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"},
		DeadLetterExchange: x + ".dlx", DeadLetterQueue: x + ".dead"})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	env := envelope("t", "poison")
	publishAll(t, p, env)
	seen := make(chan struct{}, 1)
	running(t, subscriber(t, url, x+".q", nil), procFunc(func(context.Context, *postbox.Delivery) postbox.Verdict {
		seen <- struct{}{}
		return postbox.Verdict{Action: postbox.DeadLettered}
	}))
	d := get(t, conn, x+".dead")
	if d.MessageId != env.ID {
		t.Fatalf("dead-letter queue holds %s, want %s", d.MessageId, env.ID)
	}
	if len(seen) != 1 {
		t.Fatalf("processed %d times", len(seen))
	}
}

// A Retry's delay longer than MaxRetryHold is shortened to it.
func TestRetryHoldIsCapped(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	publishAll(t, p, envelope("t", "x"))
	type seen struct {
		at time.Time
		d  *postbox.Delivery
	}
	ch := make(chan seen, 4)
	running(t, subscriber(t, url, x+".q", &postboxamqp.SubscriberConfig{MaxRetryHold: 100 * time.Millisecond}),
		procFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			ch <- seen{time.Now(), d}
			if d.Delivered == 1 {
				return postbox.Verdict{Action: postbox.Retry, Delay: time.Hour}
			}
			return postbox.Verdict{Action: postbox.Ack}
		}))
	var got []seen
	for len(got) < 2 {
		select {
		case s := <-ch:
			got = append(got, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d deliveries: the hour-long delay was not capped", len(got))
		}
	}
	if gap := got[1].at.Sub(got[0].at); gap < 100*time.Millisecond {
		t.Fatalf("redelivered after %s, before MaxRetryHold", gap)
	}
	if got[1].d.Delivered != 2 {
		t.Fatalf("second delivery counted %d", got[1].d.Delivered)
	}
}

// A held delivery goes back to the queue when Run ends, for another
// consumer to take at once.
func TestHeldDeliveryReturnsOnStop(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	env := envelope("t", "x")
	publishAll(t, p, env)
	held := make(chan struct{}, 1)
	stop := running(t, subscriber(t, url, x+".q", nil), procFunc(func(context.Context, *postbox.Delivery) postbox.Verdict {
		held <- struct{}{}
		return postbox.Verdict{Action: postbox.Retry, Delay: time.Hour}
	}))
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	stop()
	ch, proc := collect(1)
	running(t, subscriber(t, url, x+".q", nil), proc)
	if d := receive(t, ch, 1)[0]; d.ID != env.ID {
		t.Fatalf("got %s", d.ID)
	}
}

// With PerKey, a key's deliveries are processed one at a time, in the
// order received (with no retries, the queue's order).
func TestPerKeyOneAtATime(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	const keys, per = 8, 25
	for i := range per {
		var envs []*postbox.Envelope
		for k := range keys {
			env := envelope("t", fmt.Sprint(i))
			env.Key = fmt.Sprintf("k%d", k)
			env.Headers[postbox.HeaderPartitionKey] = env.Key
			envs = append(envs, env)
		}
		publishAll(t, p, envs...)
	}
	var mu sync.Mutex
	active := map[string]bool{}
	next := map[string]int{}
	var violation string
	done := make(chan struct{})
	total := 0
	running(t, subscriber(t, url, x+".q", &postboxamqp.SubscriberConfig{PerKey: true, MaxInFlight: 8}),
		procFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			mu.Lock()
			if active[d.Key] && violation == "" {
				violation = "two deliveries of " + d.Key + " at once"
			}
			active[d.Key] = true
			mu.Unlock()
			time.Sleep(200 * time.Microsecond) // widen the window for overlap
			mu.Lock()
			defer mu.Unlock()
			active[d.Key] = false
			if want := fmt.Sprint(next[d.Key]); string(d.Payload) != want && violation == "" {
				violation = fmt.Sprintf("%s: got %s, want %s", d.Key, d.Payload, want)
			}
			next[d.Key]++
			if total++; total == keys*per {
				close(done)
			}
			return postbox.Verdict{Action: postbox.Ack}
		}))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not every delivery was processed")
	}
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
}

// A lost connection ends nothing: the Subscriber dials again and resumes.
func TestSubscriberReconnects(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	px := newProxy(t, "127.0.0.1:5672")
	ch, proc := collect(100)
	running(t, subscriber(t, px.url("guest:guest"), x+".q", nil), proc)
	var envs []*postbox.Envelope
	for i := range 10 {
		envs = append(envs, envelope("t", fmt.Sprint(i)))
	}
	publishAll(t, p, envs[:5]...)
	receive(t, ch, 5)
	px.cut()
	publishAll(t, p, envs[5:]...)
	// Acks on the cut connection may have been lost, so earlier messages
	// can come again: wait for each later one.
	seen := map[string]bool{}
	missing := func() int {
		n := 0
		for _, env := range envs[5:] {
			if !seen[env.ID] {
				n++
			}
		}
		return n
	}
	for missing() > 0 {
		seen[receive(t, ch, 1)[0].ID] = true
	}
	if px.acceptCount() < 2 {
		t.Fatal("the subscriber did not reconnect")
	}
}

// A queue that does not exist ends Run with the broker's 404.
func TestMissingQueueEndsRun(t *testing.T) {
	url := brokerURL(t)
	sub := subscriber(t, url, uniqueName(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := sub.Run(ctx, procFunc(func(context.Context, *postbox.Delivery) postbox.Verdict { return postbox.Verdict{} }))
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatalf("Run = %v, want the broker's 404", err)
	}
}
