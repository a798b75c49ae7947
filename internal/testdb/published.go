package testdb

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
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

// AwaitInKeyOrder waits until n messages are published, failing t after
// 20 s, and fails t unless they are exactly each of keys' messages, with
// payloads "1" to "perKey", in that order.
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
