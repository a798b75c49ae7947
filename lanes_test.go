package postbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxtest"
)

// A relay reads with as many lanes as its share of the partitions calls
// for: Config.Lanes alone, half of them each when a second relay joins,
// all of them again when it leaves. Keys written all along keep their
// order across both changes, as partitions move between relays and
// between the lanes of one relay.
func TestRelayLanesFollowItsShare(t *testing.T) {
	driver, prefix := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	broker := postboxtest.NewBroker(nil)
	cfg := &postbox.Config{Prefix: prefix, Publisher: broker, PollInterval: 10 * time.Millisecond, Lanes: 4}
	a, err := postbox.NewClient(driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := postbox.NewClient(driver, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(context.WithoutCancel(ctx)) }()

	// Writes go on through both changes: a few keys, each with its own
	// count, written in order.
	const keys = 8
	w := writeKeys(ctx, a, keys, 0)
	defer w.finish()

	lanesAre := func(c *postbox.Client[pgx.Tx], lanes int, whole bool) func() bool {
		return func() bool {
			n, share, held, parts, ok := postbox.RelayLanes(c)
			want := parts
			if !whole {
				want = parts / 2
			}
			return ok && n == lanes && share == want && held == want
		}
	}
	waitFor(t, ctx, lanesAre(a, 4, true))
	published := func(n int) func() bool { return func() bool { return countKeyPrefix(broker, "k") >= n } }
	waitFor(t, ctx, published(100))

	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, lanesAre(a, 2, false))
	waitFor(t, ctx, lanesAre(b, 2, false))
	waitFor(t, ctx, published(countKeyPrefix(broker, "k")+100))

	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, lanesAre(a, 4, true))
	waitFor(t, ctx, published(countKeyPrefix(broker, "k")+100))

	written, err := w.finish()
	if err != nil {
		t.Fatal(err)
	}
	// Every message written is published; each key's messages first
	// reach the broker in the order written (copies of one already sent
	// may come again later).
	waitFor(t, ctx, func() bool { return distinctIDs(broker) == written })
	for k := range keys {
		inOrder(t, broker, fmt.Sprintf("k%d", k))
	}
}

// A relay reads with one lane while its batches come back short, with
// every lane its share calls for once one comes back full, and with one
// again once none has for a while. Keys written all along, a few at a
// time and in a burst, keep their order as their partitions move between
// the lanes both ways.
func TestRelayLanesFollowTheLoad(t *testing.T) {
	driver, prefix := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	broker := postboxtest.NewBroker(nil)
	const batch = 20
	a, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Publisher: broker, PollInterval: 10 * time.Millisecond, Lanes: 4, BatchSize: batch})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(context.WithoutCancel(ctx)) }()
	reading := func() int {
		n, ok := postbox.RelayReading(a)
		if !ok {
			t.Fatal("no relay running")
		}
		return n
	}
	waitFor(t, ctx, func() bool { _, _, held, n, _ := postbox.RelayLanes(a); return held == n })

	// One message at a time, each published before the next: batches of
	// one, read by one lane.
	for i := range 10 {
		if err := a.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "one", Payload: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, func() bool { return countKeyPrefix(broker, "one") > i })
		if n := reading(); n != 1 {
			t.Fatalf("%d lanes read batches of one message, want 1", n)
		}
	}

	// A trickle on a few keys all along, and a burst of many batches in
	// one transaction on others.
	const keys, burst = 8, 30 * batch
	w := writeKeys(ctx, a, keys, time.Millisecond)
	defer w.finish()
	waitFor(t, ctx, func() bool { return countKeyPrefix(broker, "k") >= 50 })
	msgs := make([]postbox.Message, burst)
	for i := range msgs {
		msgs[i] = postbox.Message{Topic: "orders.paid", Key: fmt.Sprintf("b%d", i%keys), Payload: []byte(strconv.Itoa(i / keys))}
	}
	if err := a.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	// The first full batch sets every lane reading, for at least a
	// couple of seconds after the last.
	waitFor(t, ctx, func() bool { return reading() == 4 })
	waitFor(t, ctx, func() bool { return countKeyPrefix(broker, "b") >= burst })
	n := countKeyPrefix(broker, "k")
	waitFor(t, ctx, func() bool { return countKeyPrefix(broker, "k") >= n+50 })
	trickled, err := w.finish()
	if err != nil {
		t.Fatal(err)
	}
	// Back to one lane once no batch has come back full for a while.
	waitFor(t, ctx, func() bool { return reading() == 1 })

	waitFor(t, ctx, func() bool { return distinctIDs(broker) == 10+trickled+burst })
	inOrder(t, broker, "one")
	for k := range keys {
		inOrder(t, broker, fmt.Sprintf("k%d", k))
		inOrder(t, broker, fmt.Sprintf("b%d", k))
	}
}

// keyWriter writes messages through a Client, one a transaction, on
// keys k0, k1 … in turn, each key's payloads counting from 0.
type keyWriter struct {
	stop    atomic.Bool
	wg      sync.WaitGroup
	written int // the writer's until finish
	err     error
}

// writeKeys starts writing on keys keys through c, pausing between
// writes, until finish.
func writeKeys(ctx context.Context, c *postbox.Client[pgx.Tx], keys int, pause time.Duration) *keyWriter {
	w := &keyWriter{}
	w.wg.Go(func() {
		for i := 0; !w.stop.Load(); i++ {
			msg := postbox.Message{Topic: "orders.paid", Key: fmt.Sprintf("k%d", i%keys), Payload: []byte(strconv.Itoa(i / keys))}
			if w.err = c.Write(ctx, msg); w.err != nil {
				return
			}
			w.written++
			if pause > 0 {
				time.Sleep(pause)
			}
		}
	})
	return w
}

// finish stops the writing and returns how many messages were written,
// and the failure that stopped it first, if any.
func (w *keyWriter) finish() (int, error) {
	w.stop.Store(true)
	w.wg.Wait()
	return w.written, w.err
}

// inOrder checks that key's messages, whose payloads count from 0 in the
// order written, first reached the broker in that order (copies of one
// already sent may come again later).
func inOrder(t *testing.T, broker *postboxtest.Broker, key string) {
	t.Helper()
	next := 0
	for _, p := range payloadsOf(broker, key) {
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case n == next:
			next++
		case n > next:
			t.Fatalf("key %s: message %d published before message %d", key, n, next)
		}
	}
}

func distinctIDs(b *postboxtest.Broker) int {
	seen := map[string]bool{}
	for _, m := range b.Messages() {
		seen[m.ID] = true
	}
	return len(seen)
}
