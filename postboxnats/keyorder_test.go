package postboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxnats"
)

// orderChecker is a Processor that fails some first deliveries and checks
// that each key's messages are handled one at a time and in order.
type orderChecker struct {
	t     testing.TB
	retry func(d *postbox.Delivery, first bool) (bool, time.Duration)

	mu        sync.Mutex
	active    map[string]bool
	next      map[string]int
	seen      map[string]int
	calls     int
	handedOn  int // first runs of messages delivered before: handed back unprocessed
	violation string
}

func newOrderChecker(t testing.TB, retry func(d *postbox.Delivery, first bool) (bool, time.Duration)) *orderChecker {
	return &orderChecker{t: t, retry: retry, active: map[string]bool{}, next: map[string]int{}, seen: map[string]int{}}
}

func (o *orderChecker) Process(_ context.Context, d *postbox.Delivery) postbox.Verdict {
	o.mu.Lock()
	o.calls++
	if d.Key != "" && o.active[d.Key] && o.violation == "" {
		o.violation = "two deliveries of key " + d.Key + " at once"
	}
	o.active[d.Key] = true
	first := o.seen[d.ID] == 0
	o.seen[d.ID]++
	if first && d.Delivered > 1 {
		o.handedOn++
	}
	o.mu.Unlock()

	// Give a concurrent delivery of the same key the chance to show.
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)

	o.mu.Lock()
	defer o.mu.Unlock()
	o.active[d.Key] = false
	if again, delay := o.retry(d, first); again {
		return postbox.Verdict{Action: postbox.Retry, Delay: delay}
	}
	if d.Key != "" {
		n, _ := strconv.Atoi(string(d.Payload))
		if n != o.next[d.Key] && o.violation == "" {
			o.violation = fmt.Sprintf("key %s: message %d handled when %d was due", d.Key, n, o.next[d.Key])
		}
		o.next[d.Key] = n + 1
	}
	return postbox.Verdict{Action: postbox.Ack}
}

func (o *orderChecker) done(keys []string, per int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range keys {
		if o.next[k] != per {
			return false
		}
	}
	return true
}

func (o *orderChecker) check() {
	o.t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.violation != "" {
		o.t.Fatal(o.violation)
	}
}

// TestPerKeyOrderUnderPressure: a window of 2 leaves room to hold one
// message, so most messages of a blocked key are handed back to the
// server and come back later; the order holds all the same.
func TestPerKeyOrderUnderPressure(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", nil)
		const per = 12
		keys := []string{"a", "b", "c", "d", "e"}
		for i := range per {
			for _, k := range keys {
				publishMsg(t, js, base+".t", strconv.Itoa(i), map[string]string{jetstream.MsgIDHeader: postbox.NewID(), postbox.HeaderPartitionKey: k})
			}
		}
		o := newOrderChecker(t, func(_ *postbox.Delivery, first bool) (bool, time.Duration) {
			return first && rand.IntN(3) == 0, time.Duration(rand.IntN(30)) * time.Millisecond
		})
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true, MaxInFlight: 2}), o)
		waitUntil(t, 30*time.Second, "every key to the end", func() bool { return o.done(keys, per) })
		o.check()
		o.mu.Lock()
		defer o.mu.Unlock()
		t.Logf("%d runs, %d messages handed back to the server before their first run", o.calls, o.handedOn)
		if o.handedOn == 0 {
			t.Fatal("no message was handed back: the test did not fill the room for held messages")
		}
	})
}

// TestPerKeyImmediateRetry: a retry without a delay comes back at once,
// possibly before its run has ended here; its key waits for that
// redelivery, not for AckWait.
func TestPerKeyImmediateRetry(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", nil) // AckWait 30s
		const per = 20
		keys := []string{"a", "b", "c", "d"}
		for i := range per {
			for _, k := range keys {
				publishMsg(t, js, base+".t", strconv.Itoa(i), map[string]string{jetstream.MsgIDHeader: postbox.NewID(), postbox.HeaderPartitionKey: k})
			}
		}
		o := newOrderChecker(t, func(_ *postbox.Delivery, first bool) (bool, time.Duration) { return first, 0 })
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true}), o)
		waitUntil(t, 20*time.Second, "every key to the end", func() bool { return o.done(keys, per) })
		o.check()
	})
}

// TestPerKeyHeldMessageKeptAlive: a message held behind its key's retry
// for longer than AckWait is not redelivered meanwhile, and messages
// without a key keep flowing.
func TestPerKeyHeldMessageKeptAlive(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 500 * time.Millisecond })
		const delay = 1500 * time.Millisecond
		var mu sync.Mutex
		var order []string
		var firstAt, keylessAt time.Time
		p := processorFunc(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, fmt.Sprintf("%s/%d", d.Payload, d.Delivered))
			switch {
			case string(d.Payload) == "first" && d.Delivered == 1:
				firstAt = time.Now()
				return postbox.Verdict{Action: postbox.Retry, Delay: delay}
			case string(d.Payload) == "keyless":
				keylessAt = time.Now()
			}
			return postbox.Verdict{Action: postbox.Ack}
		})
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true}), p)
		publishMsg(t, js, base+".t", "first", map[string]string{jetstream.MsgIDHeader: "1", postbox.HeaderPartitionKey: "k"})
		publishMsg(t, js, base+".t", "second", map[string]string{jetstream.MsgIDHeader: "2", postbox.HeaderPartitionKey: "k"})
		publishMsg(t, js, base+".t", "keyless", map[string]string{jetstream.MsgIDHeader: "3"})
		waitUntil(t, 15*time.Second, "both messages of the key", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(order) == 4
		})
		mu.Lock()
		defer mu.Unlock()
		var keyed []string
		for _, s := range order {
			if s != "keyless/1" {
				keyed = append(keyed, s)
			}
		}
		if want := []string{"first/1", "first/2", "second/1"}; fmt.Sprint(keyed) != fmt.Sprint(want) {
			t.Fatalf("key k handled as %v, want %v (second held, never redelivered)", keyed, want)
		}
		if keylessAt.IsZero() || keylessAt.Sub(firstAt) >= delay {
			t.Fatalf("the keyless message waited for the key's retry: %v", order)
		}
	})
}

// TestPerKeyLostRedelivery: when a retried message never comes back (here
// it is deleted from the stream), its key moves on after the retry's
// delay plus AckWait instead of blocking for good.
func TestPerKeyLostRedelivery(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = 500 * time.Millisecond })
		col := &collector{verdict: func(d *postbox.Delivery) postbox.Verdict {
			if string(d.Payload) == "doomed" {
				if err := s.DeleteMsg(context.Background(), 1); err != nil {
					t.Errorf("delete: %v", err)
				}
				return postbox.Verdict{Action: postbox.Retry, Delay: 50 * time.Millisecond}
			}
			return postbox.Verdict{Action: postbox.Ack}
		}}
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true, Logger: discardLogger()}), col)
		publishMsg(t, js, base+".t", "doomed", map[string]string{jetstream.MsgIDHeader: "1", postbox.HeaderPartitionKey: "k"})
		publishMsg(t, js, base+".t", "next", map[string]string{jetstream.MsgIDHeader: "2", postbox.HeaderPartitionKey: "k"})
		waitUntil(t, 15*time.Second, "the key's next message", func() bool { return len(col.byPayload("next")) == 1 })
		if n := len(col.byPayload("doomed")); n != 1 {
			t.Fatalf("the deleted message was processed %d times", n)
		}
	})
}

// TestPerKeyOrderAcrossServerRestart: a retried message whose nak meets
// a server restart comes back only AckWait after the server is up again,
// later than its delay plus AckWait after the nak. Its key's later
// message, held meanwhile, must wait for it rather than move on.
func TestPerKeyOrderAcrossServerRestart(t *testing.T) {
	opts := natsembed.DefaultOptions(t.TempDir())
	srv, url, err := natsembed.StartOptions(opts)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	current := srv
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		natsembed.Shutdown(current)
	})
	opts.Port = srv.Addr().(*net.TCPAddr).Port
	nc, js := connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	_, base := stream(t, js, nil)
	c := ensureConsumer(t, js, base, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
	const downFor = 2500 * time.Millisecond
	restarted := make(chan error, 1)
	var once sync.Once
	col := &collector{verdict: func(d *postbox.Delivery) postbox.Verdict {
		if string(d.Payload) != "first" {
			return postbox.Verdict{Action: postbox.Ack}
		}
		again := false
		once.Do(func() {
			again = true
			// The server goes away before the nak is sent, and comes
			// back on the same port and store after downFor.
			if err := downErr(srv, nc); err != nil {
				restarted <- err
				return
			}
			go func() {
				time.Sleep(downFor)
				s2, _, err := natsembed.StartOptions(opts)
				if err == nil {
					mu.Lock()
					current = s2
					mu.Unlock()
				}
				restarted <- err
			}()
		})
		if again {
			return postbox.Verdict{Action: postbox.Retry, Delay: 50 * time.Millisecond}
		}
		return postbox.Verdict{Action: postbox.Ack}
	}}
	runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true, Logger: discardLogger()}), col)
	publishMsg(t, js, base+".t", "first", map[string]string{jetstream.MsgIDHeader: "1", postbox.HeaderPartitionKey: "k"})
	publishMsg(t, js, base+".t", "second", map[string]string{jetstream.MsgIDHeader: "2", postbox.HeaderPartitionKey: "k"})
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the server was not restarted")
	}
	waitUntil(t, 30*time.Second, "both messages", func() bool {
		return len(col.byPayload("first")) >= 2 && len(col.byPayload("second")) >= 1
	})
	var order []string
	for _, d := range col.deliveries() {
		order = append(order, string(d.Payload))
	}
	if order[0] != "first" || order[1] != "first" {
		t.Fatalf("processed in the order %v; the key's second message must wait for the first's redelivery", order)
	}
}

// lossyConsumer hands the Subscriber every delivery but the first one of
// the message whose payload is drop: a delivery lost on the way, as when
// the node that answered the pull fails.
type lossyConsumer struct {
	jetstream.Consumer
	drop string
}

func (c *lossyConsumer) Messages(opts ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	it, err := c.Consumer.Messages(opts...)
	if err != nil {
		return nil, err
	}
	return &lossyMessages{MessagesContext: it, drop: c.drop}, nil
}

type lossyMessages struct {
	jetstream.MessagesContext
	drop    string
	dropped bool
}

func (m *lossyMessages) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	for {
		msg, err := m.MessagesContext.Next(opts...)
		if err != nil || m.dropped || string(msg.Data()) != m.drop {
			return msg, err
		}
		m.dropped = true
	}
}

// Closed lets the Subscriber wait for the client's subscription to end.
func (m *lossyMessages) Closed() <-chan struct{} {
	return m.MessagesContext.(interface{ Closed() <-chan struct{} }).Closed()
}

// TestPerKeyLostDelivery: a delivery lost on the way comes back only after
// AckWait. With Stream set, the Subscriber sees the gap in the delivery
// numbers, and the lost message's key waits for it while another key goes
// on; without it, nothing waits (and the loss is logged).
func TestPerKeyLostDelivery(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		for _, withStream := range []bool{true, false} {
			t.Run(fmt.Sprintf("stream=%v", withStream), func(t *testing.T) {
				_, js := connect(t, url)
				s, base := stream(t, js, nil)
				c := ensureConsumer(t, js, base, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
				logs := &pubtest.Logs{}
				cfg := &postboxnats.SubscriberConfig{PerKey: true, Logger: slog.New(slog.NewTextHandler(logs, nil))}
				if withStream {
					cfg.Stream = s
				}
				col := &collector{}
				runSubscriber(t, subscriber(t, &lossyConsumer{Consumer: c, drop: "k2"}, cfg), col)
				for i, m := range []struct{ payload, key string }{{"k1", "k"}, {"k2", "k"}, {"k3", "k"}, {"j1", "j"}} {
					publishMsg(t, js, base+".t", m.payload, map[string]string{jetstream.MsgIDHeader: strconv.Itoa(i), postbox.HeaderPartitionKey: m.key})
				}
				waitUntil(t, 15*time.Second, "every message", func() bool {
					return len(col.byPayload("k2")) > 0 && len(col.byPayload("k3")) > 0 && len(col.byPayload("j1")) > 0
				})
				at := map[string]int{}
				for i, d := range col.deliveries() {
					if _, ok := at[string(d.Payload)]; !ok {
						at[string(d.Payload)] = i
					}
				}
				if at["k2"] == 0 || col.byPayload("k2")[0].Delivered < 2 {
					t.Fatalf("the lost delivery was not lost: order %v", at)
				}
				if withStream && (at["k3"] < at["k2"] || at["j1"] > at["k2"]) {
					t.Fatalf("want k1, j1, k2, k3 (k waits for its lost message, j does not); got %v", at)
				}
				// The gap is reported either way: with the keys it holds,
				// or with what would have held them.
				want := "keys_held=1"
				if !withStream {
					want = "set SubscriberConfig.Stream to hold those keys"
				}
				if got := logs.String(); !strings.Contains(got, "deliveries were lost on the way") || !strings.Contains(got, want) {
					t.Fatalf("the subscriber's log does not report the loss with %q:\n%s", want, got)
				}
			})
		}
	})
}

// TestSubscriberStreamMustBeTheConsumers: a Stream other than the
// consumer's is refused, naming the field.
func TestSubscriberStreamMustBeTheConsumers(t *testing.T) {
	_, js := connect(t, sharedEmbedded(t))
	_, base := stream(t, js, nil)
	other, _ := stream(t, js, nil)
	c := ensureConsumer(t, js, base, "c", nil)
	_, err := postboxnats.NewSubscriber(c, &postboxnats.SubscriberConfig{PerKey: true, Stream: other})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "Stream" {
		t.Fatalf("want a *postbox.ConfigError naming Stream; got %v", err)
	}
}
