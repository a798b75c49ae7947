package postbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxdriver"
)

// A relay whose Executor is a postboxdriver.Warmer warms its connections
// once, for its lanes' reads, before it takes a partition; a warm-up that
// fails is logged and the relay runs all the same.
func TestRelayWarmsBeforeTakingPartitions(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := "warmed"
		if fail {
			name = "warm-up failed"
		}
		t.Run(name, func(t *testing.T) {
			d, prefix := newDriver(t)
			ctx := context.Background()
			st := &warmingStore{}
			if fail {
				st.err = errors.New("the database is away")
			}
			wrapped := driverFunc(func(p string) (postboxdriver.Store[pgx.Tx], error) {
				s, err := d.Open(p)
				st.Store = s
				return st, err
			})
			published := make(chan struct{})
			var once sync.Once
			pub := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error {
				once.Do(func() { close(published) })
				return nil
			})
			logs := &pubtest.Logs{}
			c, err := postbox.NewClient[pgx.Tx](wrapped, &postbox.Config{Prefix: prefix, Publisher: pub, Lanes: 3, BatchSize: 7,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Write(ctx, postbox.Message{Topic: "orders.created", Payload: []byte("{}")}); err != nil {
				t.Fatal(err)
			}
			if err := c.Start(ctx); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, published, "the message to be published")
			if err := c.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			st.mu.Lock()
			calls := st.calls
			st.mu.Unlock()
			if len(calls) != 1 {
				t.Fatalf("Warm called %d times, want once", len(calls))
			}
			w := calls[0]
			if w.afterCoordinate || len(w.p.Fence.Generations) != 0 || w.conns != 3 || w.p.Limit != 7 {
				t.Fatalf("Warm after the relay's first Coordinate %v, with %d partitions, %d connections, limit %d; want before it, none, 3 (the lanes) and 7",
					w.afterCoordinate, len(w.p.Fence.Generations), w.conns, w.p.Limit)
			}
			warned := strings.Contains(logs.String(), "could not ready its connections")
			if warned != fail {
				t.Fatalf("warning logged %v, want %v:\n%s", warned, fail, logs.String())
			}
		})
	}
}

// warmingStore is an outbox Store standing for a Warmer: it records each
// Warm and whether the relay had called Coordinate before it.
type warmingStore struct {
	postboxdriver.Store[pgx.Tx]
	err         error
	coordinated atomic.Bool
	mu          sync.Mutex
	calls       []warmCall
}

type warmCall struct {
	p               postboxdriver.FetchParams
	conns           int
	afterCoordinate bool
}

func (s *warmingStore) Warm(_ context.Context, p postboxdriver.FetchParams, conns int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, warmCall{p: p, conns: conns, afterCoordinate: s.coordinated.Load()})
	return s.err
}

func (s *warmingStore) Coordinate(ctx context.Context, id string, ttl time.Duration, want, drop, settled []int) (postboxdriver.Membership, error) {
	s.coordinated.Store(true)
	return s.Store.Coordinate(ctx, id, ttl, want, drop, settled)
}
