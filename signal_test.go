package postbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
