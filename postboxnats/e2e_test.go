package postboxnats_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxnats"
)

// TestEndToEnd writes messages over many keys to PostgreSQL, runs the
// relay with this Publisher, and reads the stream back: every message
// stored exactly once, each key's messages in write order.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	const keys, perKey = 50, 40 // 2,000 messages
	eachTarget(t, func(t *testing.T, url string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)

		_, prefix, d := pubtest.Tables(t)
		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		c, err := postbox.NewClient(d, &postbox.Config{
			Prefix:    prefix,
			Publisher: pub,
			Logger:    slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}

		// Write order per key is the order of these writes: one key's
		// messages are spread over many transactions, interleaved with
		// every other key's.
		ids := map[string]bool{}
		for i := 0; i < perKey; i++ {
			msgs := make([]postbox.Message, 0, keys)
			for k := 0; k < keys; k++ {
				msg := postbox.Message{
					ID:          postbox.NewID(),
					Topic:       "orders.changed",
					Key:         fmt.Sprintf("order-%02d", k),
					Payload:     []byte(fmt.Sprintf("order-%02d:%04d", k, i)),
					ContentType: "text/plain",
				}
				ids[msg.ID] = true
				msgs = append(msgs, msg)
			}
			if err := c.Write(ctx, msgs...); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		stopped := false
		stop := func() {
			if !stopped {
				stopped = true
				if err := c.Stop(ctx); err != nil {
					t.Errorf("stop: %v", err)
				}
			}
		}
		defer stop()

		// Read the stream as it fills; each Fetch waits a bounded time.
		cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		next := map[string]int{}
		seen := map[string]bool{}
		for len(seen) < len(ids) && ctx.Err() == nil {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			for msg := range batch.Messages() {
				h := msg.Headers()
				id := h.Get(jetstream.MsgIDHeader)
				if !ids[id] {
					t.Fatalf("unknown message id %q", id)
				}
				if seen[id] {
					t.Fatalf("message %s stored twice", id)
				}
				seen[id] = true
				if h.Get(postbox.HeaderID) != id || h.Get(postbox.HeaderContentType) != "text/plain" {
					t.Fatalf("headers not carried: %v", h)
				}
				key, n, ok := strings.Cut(string(msg.Data()), ":")
				if !ok || h.Get(postbox.HeaderPartitionKey) != key {
					t.Fatalf("payload %q does not match key header %q", msg.Data(), h.Get(postbox.HeaderPartitionKey))
				}
				i, _ := strconv.Atoi(n)
				if i != next[key] {
					t.Fatalf("key %s: got message %d, want %d (order broken)", key, i, next[key])
				}
				next[key]++
			}
			if err := batch.Error(); err != nil {
				t.Fatal(err)
			}
		}
		if len(seen) != len(ids) {
			t.Fatalf("read %d of %d messages before the deadline", len(seen), len(ids))
		}
		stop()

		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending != 0 || st.Dead != 0 {
			t.Fatalf("after the relay stopped: %d pending, %d dead; want none", st.Pending, st.Dead)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != uint64(len(ids)) {
			t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, len(ids))
		}
		for k := 0; k < keys; k++ {
			if key := fmt.Sprintf("order-%02d", k); next[key] != perKey {
				t.Fatalf("key %s: %d messages, want %d", key, next[key], perKey)
			}
		}
	})
}
