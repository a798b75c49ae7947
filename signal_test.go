package postbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// A relay hears the change signal of a write made by a Client of another
// pool (as another process would), and publishes the row; a Client with
// NoSignals sends none, and a relay with NoSignals does not listen.
func TestRelayHearsWritesOfOtherProcesses(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker := postboxtest.NewBroker(nil)
	relay, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, Publisher: broker, PollInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := relay.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
			t.Error(err)
		}
	}()
	waitFor(t, ctx, func() bool { l, _, _ := postbox.RelaySignals(relay); return l })

	other := testdb.PoolAt(t, testdb.PostgresURL())
	quiet, err := postbox.NewClient(postboxpgx.New(other), &postbox.Config{Prefix: prefix, NoSignals: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := quiet.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "a", Payload: []byte("quiet")}); err != nil {
		t.Fatal(err)
	}
	writer, err := postbox.NewClient(postboxpgx.New(other), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "b", Payload: []byte("signalled")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "b")) == 1 })
	waitFor(t, ctx, func() bool { _, heard, _ := postbox.RelaySignals(relay); return heard >= 1 })
	// The quiet write is published too: by the signal of the later write,
	// which wakes every lane, or by the poll.
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "a")) == 1 })

	polling, err := postbox.NewClient(postboxpgx.New(other), &postbox.Config{Prefix: prefix, Publisher: broker, NoSignals: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := polling.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "c", Payload: []byte("polled")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "c")) == 1 })
	if listening, heard, _ := postbox.RelaySignals(polling); listening || heard != 0 {
		t.Fatalf("a relay with NoSignals: listening %v, %d signals heard", listening, heard)
	}
	if err := polling.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// Relays hand partitions over on the change signals, not at their next
// renewal: with renewals minutes apart (a 10-minute lease, a 1-minute
// poll), a relay joining gets its share, and the one that stays gets the
// whole table back when the other stops, within the test's 30 s. Each
// step is a few statements: the joining relay's announcement, the other's
// renewal and release, another announcement, the take.
func TestRelaysHandPartitionsOverOnSignals(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	broker := postboxtest.NewBroker(nil)
	cfg := func() *postbox.Config {
		return &postbox.Config{Prefix: prefix, Publisher: broker, PollInterval: time.Minute, LeaseDuration: 10 * time.Minute}
	}
	a, err := postbox.NewClient(postboxpgx.New(pool), cfg())
	if err != nil {
		t.Fatal(err)
	}
	b, err := postbox.NewClient(postboxpgx.New(testdb.PoolAt(t, testdb.PostgresURL())), cfg())
	if err != nil {
		t.Fatal(err)
	}
	holds := func(c *postbox.Client[pgx.Tx], whole bool) func() bool {
		return func() bool {
			_, share, held, parts, ok := postbox.RelayLanes(c)
			want := parts
			if !whole {
				want = parts / 2
			}
			listening, _, _ := postbox.RelaySignals(c)
			return ok && listening && share == want && held == want
		}
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(context.WithoutCancel(ctx)) }()
	waitFor(t, ctx, holds(a, true))
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, holds(b, false))
	waitFor(t, ctx, holds(a, false))
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, holds(a, true))
	// The partitions moved, and the rows written to them are published.
	if err := a.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "k")) == 1 })
}
