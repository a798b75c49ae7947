package postboxredis_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxredis"
)

// No ignores: every client a test opens is closed by its cleanup, and
// Publishers and Runs end their goroutines on Close and when Run returns.
func TestMain(m *testing.M) {
	// The client logs every failed dial; the tests that stop Redis or
	// dial nothing make many on purpose.
	redis.SetLogger(silent{})
	goleak.VerifyTestMain(m)
}

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

// redisAddr is the machine's Redis; POSTBOX_TEST_REDIS_ADDR overrides it.
func redisAddr() string {
	if a := os.Getenv("POSTBOX_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

var quiet = slog.New(slog.DiscardHandler)

// client opens a client on the machine's Redis, closed when t ends, and
// skips the test when Redis cannot be reached.
func client(t testing.TB, mod func(*redis.Options)) *redis.Client {
	t.Helper()
	opt := &redis.Options{Addr: redisAddr()}
	if mod != nil {
		mod(opt)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("Redis at %s is unreachable (%v); set POSTBOX_TEST_REDIS_ADDR to run against another", opt.Addr, err)
	}
	return c
}

var nameSeq atomic.Int64

// uniqueName returns a name no other test, process or run uses.
func uniqueName() string {
	return fmt.Sprintf("pbxt:%d:%d:%d", os.Getpid(), time.Now().UnixNano()%1_000_000_000, nameSeq.Add(1))
}

// cleanup deletes keys when t ends: the streams a test made, and every
// dedupe key of them.
func cleanup(t testing.TB, keys ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := redis.NewClient(&redis.Options{Addr: redisAddr()})
		defer c.Close()
		for _, k := range keys {
			var all []string
			iter := c.Scan(ctx, 0, "{"+k+"}"+postboxredis.DedupeKeySuffix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				all = append(all, iter.Val())
			}
			all = append(all, k)
			if err := c.Del(ctx, all...).Err(); err != nil {
				t.Logf("cleanup %s: %v", k, err)
			}
		}
	})
}

// stream makes a stream with the given groups, each starting at the
// beginning, deleted when t ends.
func stream(t testing.TB, c redis.UniversalClient, groups ...string) string {
	t.Helper()
	name := uniqueName()
	cleanup(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, g := range groups {
		if err := postboxredis.EnsureGroup(ctx, c, name, g, postboxredis.StartAtBeginning); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

func publisher(t testing.TB, c redis.UniversalClient, cfg *postboxredis.Config) *postboxredis.Publisher {
	t.Helper()
	p, err := postboxredis.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close publisher: %v", err)
		}
	})
	return p
}

func subscriber(t testing.TB, c redis.UniversalClient, cfg postboxredis.SubscriberConfig) *postboxredis.Subscriber {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s, err := postboxredis.NewSubscriber(c, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// running runs sub with p until t ends, and fails t if Run returns an
// error or does not return within 30s of its context's end.
func running(t testing.TB, sub postbox.Subscriber, p postbox.Processor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx, p) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("subscriber Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("subscriber Run did not return within 30s of its context's end")
		}
	}
	t.Cleanup(stop)
	return stop
}

// publish publishes env and returns its outcome.
func publish(t testing.TB, p postbox.Publisher, ctx context.Context, env *postbox.Envelope) error {
	t.Helper()
	return pubtest.Publish(t, ctx, p, env, 20*time.Second)
}

func envelope(topic, key, payload string) *postbox.Envelope {
	id := postbox.NewID()
	h := map[string]string{
		postbox.HeaderSpecVersion: "1.0", postbox.HeaderID: id, postbox.HeaderType: topic,
		postbox.HeaderSource: "postboxredis-test",
	}
	if key != "" {
		h[postbox.HeaderPartitionKey] = key
	}
	return &postbox.Envelope{ID: id, Topic: topic, Key: key, Payload: []byte(payload), Headers: h, CreatedAt: time.Now(), Attempt: 1}
}

func mustPermanent(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustPermanent(t, err, target)
}

func mustMessage(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustMessage(t, err, target)
}

func mustInfra(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustInfra(t, err, target)
}
