package testdb

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Published collects what a Client's relay publishes, each message as
// key/payload, for the drivers' tests of WithLog.
type Published struct {
	mu  sync.Mutex
	got []string
}

// Config is a Client's configuration for prefix whose relay publishes
// into p, polling every 20 ms and logging nothing.
func (p *Published) Config(prefix string) *postbox.Config {
	return &postbox.Config{
		Prefix: prefix, PollInterval: 20 * time.Millisecond,
		Publisher: postbox.PublisherFunc(func(_ context.Context, e *postbox.Envelope) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.got = append(p.got, e.Key+"/"+string(e.Payload))
			return nil
		}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// AwaitInKeyOrder waits until as many messages as keys have perKey each
// are published, failing t after 20 s, and fails t unless they are
// exactly each key's messages, with payloads "1" to perKey, in that
// order, each once.
func (p *Published) AwaitInKeyOrder(t *testing.T, keys []string, perKey int) {
	t.Helper()
	n := len(keys) * perKey
	deadline := time.Now().Add(20 * time.Second)
	for {
		p.mu.Lock()
		got := slices.Clone(p.got)
		p.mu.Unlock()
		if len(got) >= n {
			for _, key := range keys {
				last := -1
				for i := 1; i <= perKey; i++ {
					j := slices.Index(got, key+"/"+strconv.Itoa(i))
					if j <= last {
						t.Fatalf("published %v: want %s's messages 1 to %d in that order, each once", got, key, perKey)
					}
					last = j
				}
			}
			if len(got) != n {
				t.Fatalf("published %v, want %d messages", got, n)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("published %d of %d messages", len(got), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogRows counts the rows of prefix's log and outbox.
func LogRows(t *testing.T, pool *pgxpool.Pool, prefix string) (log, outbox int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+prefix+`log), (SELECT count(*) FROM `+prefix+`outbox)`).Scan(&log, &outbox)
	if err != nil {
		t.Fatal(err)
	}
	return log, outbox
}

// HearsWrite listens with l, calls write once l listens, and fails t
// unless l hears a change signal for the write: a committed write of key
// "k", naming its partition. It stops listening before it returns.
func HearsWrite(t *testing.T, ctx context.Context, l postboxdriver.Listener, write func()) {
	t.Helper()
	ready := make(chan struct{})
	heard := make(chan postboxdriver.Heard, 10)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Listen(lctx, func() { close(ready) }, func(h postboxdriver.Heard) { heard <- h }) }()
	ended := false
	defer func() {
		stop()
		if ended {
			return
		}
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("listen returned %v after its context ended", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		ended = true
		t.Fatalf("listen ended before it was ready: %v", err)
	}
	write()
	select {
	case h := <-heard:
		if want := []int{postboxdriver.PartitionOf("k", "", 64)}; !slices.Equal(h.Partitions, want) || !h.Committed {
			t.Fatalf("heard %+v, want partitions %v, committed", h, want)
		}
	case <-ctx.Done():
		t.Fatal("no change signal heard for the write")
	}
}
