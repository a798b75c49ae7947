package postboxkafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxkafka"
)

// No ignores: every kfake cluster and client a test makes is closed by its
// cleanup, and Publishers and Subscribers end their goroutines on Close
// and when Run returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

var nameSeq atomic.Int64

// uniqueName returns a name no other test in this process uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s.%d.%d", prefix, os.Getpid(), nameSeq.Add(1))
}

// cluster starts an in-process Kafka of three brokers, closed when t ends.
func cluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(3)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// client returns a client of c, closed when t ends (before c closes).
func client(t testing.TB, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// ensure creates topic on cl's cluster with partitions and three replicas.
func ensure(t testing.TB, cl *kgo.Client, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postboxkafka.EnsureTopic(ctx, cl, topic, partitions, 3, configs); err != nil {
		t.Fatal(err)
	}
}

// publisher returns a Publisher over cl, closed when t ends.
func publisher(t testing.TB, cl *kgo.Client, cfg *postboxkafka.Config) *postboxkafka.Publisher {
	t.Helper()
	c := postboxkafka.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = quiet
	}
	p, err := postboxkafka.New(cl, &c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close publisher: %v", err)
		}
	})
	return p
}

// groupOpts makes group membership quick to settle on kfake.
func groupOpts(c *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
}

// subscriber returns a Subscriber of group on topics of c.
func subscriber(t testing.TB, c *kfake.Cluster, group string, topics []string, cfg *postboxkafka.SubscriberConfig, opts ...kgo.Opt) *postboxkafka.Subscriber {
	t.Helper()
	sc := postboxkafka.SubscriberConfig{CommitInterval: 10 * time.Millisecond}
	if cfg != nil {
		sc = *cfg
	}
	if sc.Logger == nil {
		sc.Logger = quiet
	}
	s, err := postboxkafka.NewSubscriber(group, topics, &sc, append(groupOpts(c), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// running runs sub with p until the returned stop is called or t ends;
// stop waits, at most 30s, for Run to return, and fails t on an error.
func running(t testing.TB, sub postbox.Subscriber, p postbox.Processor) (stop func()) {
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
					t.Errorf("subscriber Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("subscriber Run did not return within 30s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// envelope makes an envelope as the relay would.
func envelope(topic, key string, payload string) *postbox.Envelope {
	id := postbox.NewID()
	h := map[string]string{
		postbox.HeaderSpecVersion: "1.0", postbox.HeaderID: id, postbox.HeaderType: topic,
		postbox.HeaderSource: "test", postbox.HeaderTime: time.Now().UTC().Format(time.RFC3339Nano),
	}
	if key != "" {
		h[postbox.HeaderPartitionKey] = key
	}
	return &postbox.Envelope{ID: id, Topic: topic, Key: key, Payload: []byte(payload), Headers: h, CreatedAt: time.Now(), Attempt: 1}
}

// publish publishes env and returns its outcome.
func publish(t testing.TB, ctx context.Context, p postbox.Publisher, env *postbox.Envelope) error {
	t.Helper()
	return pubtest.Publish(t, ctx, p, env, 30*time.Second)
}

// consumeAll reads every record of topic from the start, with a client of
// its own, until n records arrived or 30s passed.
func consumeAll(t testing.TB, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := client(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from %s within 30s", len(out), n, topic)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// header returns the value of the header named k, and whether r has it.
func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}
