package postboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/postboxnats"
)

// processorFunc adapts a function to postbox.Processor.
type processorFunc func(ctx context.Context, d *postbox.Delivery) postbox.Verdict

func (f processorFunc) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	return f(ctx, d)
}

// testLogger logs warnings and errors into the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ensureConsumer makes a durable pull consumer on stream for a test.
// The stream's deletion removes it.
func ensureConsumer(t testing.TB, js jetstream.JetStream, stream, name string, mod func(*jetstream.ConsumerConfig)) jetstream.Consumer {
	t.Helper()
	cfg := jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := postboxnats.EnsureConsumer(ctx, js, stream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func subscriber(t testing.TB, c jetstream.Consumer, cfg *postboxnats.SubscriberConfig) *postboxnats.Subscriber {
	t.Helper()
	if cfg == nil {
		cfg = &postboxnats.SubscriberConfig{}
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := postboxnats.NewSubscriber(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// running is a Run in progress.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// runSubscriber runs s with p until stop or the end of the test.
func runSubscriber(t testing.TB, s postbox.Subscriber, p postbox.Processor) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx, p) }()
	t.Cleanup(func() {
		if err := r.stop(30 * time.Second); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// stop cancels the Run and returns its result, or an error when it does
// not return within d.
func (r *running) stop(d time.Duration) error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(d):
			r.err = fmt.Errorf("Run did not return within %s of its context ending", d)
		}
	})
	return r.err
}

// waitUntil polls cond, failing the test after a bounded wait.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func publishMsg(t testing.TB, js jetstream.JetStream, subject, data string, headers map[string]string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte(data)
	for k, v := range headers {
		m.Header[k] = []string{v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatalf("publish on %s: %v", subject, err)
	}
}

func consumerInfo(t testing.TB, c jetstream.Consumer) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// collector records deliveries and answers with verdict (nil: Ack).
type collector struct {
	mu      sync.Mutex
	got     []*postbox.Delivery
	verdict func(d *postbox.Delivery) postbox.Verdict
}

func (c *collector) Process(_ context.Context, d *postbox.Delivery) postbox.Verdict {
	c.mu.Lock()
	c.got = append(c.got, d)
	c.mu.Unlock()
	if c.verdict != nil {
		return c.verdict(d)
	}
	return postbox.Verdict{Action: postbox.Ack}
}

func (c *collector) deliveries() []*postbox.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*postbox.Delivery(nil), c.got...)
}

func (c *collector) byPayload(p string) []*postbox.Delivery {
	var out []*postbox.Delivery
	for _, d := range c.deliveries() {
		if string(d.Payload) == p {
			out = append(out, d)
		}
	}
	return out
}

func TestSubscriberConfigRejected(t *testing.T) {
	_, js := connect(t, sharedEmbedded(t))
	_, base := stream(t, js, nil)
	c := ensureConsumer(t, js, base, "c", nil)
	_, err := postboxnats.NewSubscriber(c, &postboxnats.SubscriberConfig{
		MaxInFlight:   -1,
		SubjectPrefix: "no-dot",
		Topic:         func(string, nats.Header) string { return "x" },
	})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want *postbox.ConfigError", err)
	}
	fields := map[string]int{}
	for _, p := range ce.Problems {
		fields[p.Field]++
	}
	if fields["MaxInFlight"] != 1 || fields["SubjectPrefix"] != 2 {
		t.Fatalf("problems %v, want MaxInFlight once and SubjectPrefix twice (no dot; set with Topic)", err)
	}
	if _, err := postboxnats.NewSubscriber(c, &postboxnats.SubscriberConfig{MaxInFlight: 5000}); !errors.As(err, &ce) {
		t.Fatalf("MaxInFlight 5000: %v, want a ConfigError", err)
	}
	if _, err := postboxnats.NewSubscriber(nil, nil); err == nil {
		t.Fatal("NewSubscriber(nil) succeeded")
	}
	s := subscriber(t, c, nil)
	if got := s.Config().MaxInFlight; got != postboxnats.DefaultMaxInFlight {
		t.Fatalf("default MaxInFlight %d", got)
	}
	if err := s.Run(context.Background(), nil); err == nil {
		t.Fatal("Run with a nil Processor succeeded")
	}

	// A consumer made elsewhere with AckAll is refused.
	ctx := context.Background()
	all, err := js.CreateOrUpdateConsumer(ctx, base, jetstream.ConsumerConfig{Durable: "all", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := postboxnats.NewSubscriber(all, nil); !errors.Is(err, postboxnats.ErrConsumerConfig) {
		t.Fatalf("AckAll consumer: %v, want ErrConsumerConfig", err)
	}
}

func TestEnsureConsumer(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		cfg := jetstream.ConsumerConfig{Durable: "billing", AckWait: 10 * time.Second, MaxDeliver: -1}
		if _, err := postboxnats.EnsureConsumer(ctx, js, base, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := postboxnats.EnsureConsumer(ctx, js, base, cfg); err != nil {
			t.Fatalf("second EnsureConsumer: %v", err)
		}
		cfg.AckWait = 20 * time.Second
		c, err := postboxnats.EnsureConsumer(ctx, js, base, cfg)
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		info := consumerInfo(t, c)
		if info.Config.AckWait != 20*time.Second || info.Config.AckPolicy != jetstream.AckExplicitPolicy || info.Config.Durable != "billing" {
			t.Fatalf("config not applied: %+v", info.Config)
		}
		for name, bad := range map[string]jetstream.ConsumerConfig{
			"no durable":      {AckWait: time.Second},
			"name mismatch":   {Durable: "a", Name: "b"},
			"push":            {Durable: "p", DeliverSubject: "somewhere"},
			"ack none":        {Durable: "n", AckPolicy: jetstream.AckNonePolicy},
			"ack all":         {Durable: "l", AckPolicy: jetstream.AckAllPolicy},
			"max deliver one": {Durable: "m", MaxDeliver: 1},
		} {
			if _, err := postboxnats.EnsureConsumer(ctx, js, base, bad); !errors.Is(err, postboxnats.ErrConsumerConfig) {
				t.Errorf("%s: %v, want ErrConsumerConfig", name, err)
			}
		}
		if _, err := postboxnats.EnsureConsumer(ctx, js, uniqueName(), cfg); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("missing stream: %v, want ErrStreamNotFound", err)
		}
		st, err := js.Stream(ctx, base)
		if err != nil {
			t.Fatal(err)
		}
		names := st.ConsumerNames(ctx)
		n := 0
		for range names.Name() {
			n++
		}
		if n != 1 {
			t.Fatalf("%d consumers on the stream, want only the valid one", n)
		}
	})
}

// TestDeliveryFromMessage maps headers, subject and metadata to the
// Delivery, for postbox's own messages and for other producers'.
func TestDeliveryFromMessage(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		prefix := base + "."
		c := ensureConsumer(t, js, base, "c", nil)
		col := &collector{}
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{SubjectPrefix: prefix}), col)

		// As the Publisher sends it.
		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: prefix})
		env := envelope("orders.created", "one")
		env.Key = "order-7"
		env.Headers[postbox.HeaderID] = env.ID
		env.Headers[postbox.HeaderPartitionKey] = env.Key
		env.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		if err := publish(t, pub, context.Background(), env); err != nil {
			t.Fatal(err)
		}
		// Another producer: ce-id only, headers in other cases, no ce-type.
		publishMsg(t, js, prefix+"billing.paid", "two", map[string]string{"Ce-Id": "ext-2", "CE-PartitionKey": "acct-1", "x-a": "b"})
		// Both ids: Nats-Msg-Id wins.
		publishMsg(t, js, prefix+"x", "three", map[string]string{jetstream.MsgIDHeader: "nats-3", postbox.HeaderID: "ce-3"})

		waitUntil(t, 15*time.Second, "three deliveries", func() bool { return len(col.deliveries()) >= 3 })
		one, two, three := col.byPayload("one")[0], col.byPayload("two")[0], col.byPayload("three")[0]
		if one.ID != env.ID || one.Topic != "orders.created" || one.Key != "order-7" || one.Delivered != 1 ||
			one.Headers["traceparent"] != env.Headers["traceparent"] || one.Headers[postbox.HeaderSource] != "postboxnats-test" {
			t.Errorf("postbox message: %+v", one)
		}
		for k := range one.Headers {
			if strings.HasPrefix(strings.ToLower(k), "nats-") {
				t.Errorf("header %s passed on; Nats-* headers are transport", k)
			}
		}
		if two.ID != "ext-2" || two.Key != "acct-1" || two.Topic != "billing.paid" || two.Headers["x-a"] != "b" {
			t.Errorf("foreign message: %+v", two)
		}
		if three.ID != "nats-3" || three.Topic != "x" {
			t.Errorf("message with both ids: %+v", three)
		}
	})

	t.Run("topic function", func(t *testing.T) {
		_, js := connect(t, sharedEmbedded(t))
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", nil)
		col := &collector{}
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{Topic: func(subject string, h nats.Header) string {
			return "mapped:" + strings.TrimPrefix(subject, base+".") + ":" + h.Get("x-kind")
		}}), col)
		publishMsg(t, js, base+".a.b", "p", map[string]string{jetstream.MsgIDHeader: "id-1", postbox.HeaderType: "ignored", "x-kind": "k"})
		waitUntil(t, 15*time.Second, "the delivery", func() bool { return len(col.deliveries()) == 1 })
		if got := col.deliveries()[0].Topic; got != "mapped:a.b:k" {
			t.Fatalf("topic %q", got)
		}
	})
}

// TestMessageWithoutIDTerminated: a message with neither Nats-Msg-Id nor
// ce-id never reaches the processor and is not redelivered.
func TestMessageWithoutIDTerminated(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
		col := &collector{}
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{Logger: slog.New(slog.DiscardHandler)}), col)
		publishMsg(t, js, base+".t", "anonymous", map[string]string{"x": "y"})
		publishMsg(t, js, base+".t", "sentinel", map[string]string{jetstream.MsgIDHeader: "s"})
		waitUntil(t, 15*time.Second, "the sentinel", func() bool { return len(col.byPayload("sentinel")) == 1 })
		waitUntil(t, 15*time.Second, "nothing pending", func() bool {
			info := consumerInfo(t, c)
			return info.NumAckPending == 0 && info.NumPending == 0
		})
		if n := len(col.byPayload("anonymous")); n != 0 {
			t.Fatalf("the message without an id was processed %d times", n)
		}
	})
}

// TestRunEnds: Run returns nil once ctx ends, after the delivery in
// progress has finished (its handler sees ctx end) and been settled.
func TestRunEnds(t *testing.T) {
	_, js := connect(t, sharedEmbedded(t))
	_, base := stream(t, js, nil)
	c := ensureConsumer(t, js, base, "c", nil)
	entered := make(chan struct{})
	var after atomic.Int32
	p := processorFunc(func(ctx context.Context, _ *postbox.Delivery) postbox.Verdict {
		close(entered)
		<-ctx.Done()
		after.Add(1)
		return postbox.Verdict{Action: postbox.Retry, Delay: 5 * time.Millisecond}
	})
	r := runSubscriber(t, subscriber(t, c, nil), p)
	publishMsg(t, js, base+".t", "x", map[string]string{jetstream.MsgIDHeader: "1"})
	select {
	case <-entered:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery")
	}
	if err := r.stop(15 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if after.Load() != 1 {
		t.Fatal("Run returned before the delivery in progress finished")
	}
	// The retry was settled with a nak, so the message is redelivered at
	// once to the next Run, not after AckWait (30s).
	col := &collector{}
	runSubscriber(t, subscriber(t, c, nil), col)
	waitUntil(t, 10*time.Second, "the redelivery", func() bool { return len(col.deliveries()) == 1 })
	if d := col.deliveries()[0]; d.Delivered != 2 {
		t.Fatalf("redelivery counted %d deliveries, want 2", d.Delivered)
	}
	if err := subscriber(t, c, nil).Run(canceled(), col); err != nil {
		t.Fatalf("Run with an ended context: %v", err)
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestRunFails: Run returns an error, not nil, when its subscription
// fails for good.
func TestRunFails(t *testing.T) {
	t.Run("consumer deleted", func(t *testing.T) {
		eachTarget(t, func(t *testing.T, url string) {
			_, js := connect(t, url)
			_, base := stream(t, js, nil)
			c := ensureConsumer(t, js, base, "gone", nil)
			done := make(chan error, 1)
			go func() { done <- subscriber(t, c, nil).Run(context.Background(), &collector{}) }()
			// Let the pull reach the server before the consumer goes.
			waitUntil(t, 10*time.Second, "a waiting pull", func() bool { return consumerInfo(t, c).NumWaiting > 0 })
			if err := js.DeleteConsumer(context.Background(), base, "gone"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("Run returned nil after its consumer was deleted")
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Run did not return after its consumer was deleted")
			}
		})
	})
	t.Run("connection closed", func(t *testing.T) {
		nc, js := connect(t, sharedEmbedded(t))
		_, base := stream(t, js, nil)
		// The stream is deleted through a connection of its own.
		c := ensureConsumer(t, js, base, "c", nil)
		done := make(chan error, 1)
		go func() { done <- subscriber(t, c, nil).Run(context.Background(), &collector{}) }()
		waitUntil(t, 10*time.Second, "a waiting pull", func() bool { return consumerInfo(t, c).NumWaiting > 0 })
		nc.Close()
		select {
		case err := <-done:
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				t.Fatalf("Run: %v, want it to wrap jetstream.ErrMsgIteratorClosed", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Run did not return after its connection closed")
		}
		_, js2 := connect(t, sharedEmbedded(t))
		deleteStream(t, js2, base)
	})
}

// TestMaxInFlight: no more deliveries are processed at once than
// MaxInFlight, though the server has more on their way.
func TestMaxInFlight(t *testing.T) {
	_, js := connect(t, sharedEmbedded(t))
	_, base := stream(t, js, nil)
	c := ensureConsumer(t, js, base, "c", nil)
	const window, n = 4, 40
	for i := range n {
		publishMsg(t, js, base+".t", fmt.Sprint(i), map[string]string{jetstream.MsgIDHeader: fmt.Sprint(i)})
	}
	var active, peak, total atomic.Int32
	gate := make(chan struct{})
	p := processorFunc(func(context.Context, *postbox.Delivery) postbox.Verdict {
		a := active.Add(1)
		for {
			m := peak.Load()
			if a <= m || peak.CompareAndSwap(m, a) {
				break
			}
		}
		<-gate
		active.Add(-1)
		total.Add(1)
		return postbox.Verdict{Action: postbox.Ack}
	})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	// Registered after runSubscriber's cleanup, so it runs first: a
	// failing check must not leave Run blocked in the processor.
	runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{MaxInFlight: window}), p)
	t.Cleanup(open)
	waitUntil(t, 10*time.Second, "a full window", func() bool { return active.Load() == window })
	// The client usually holds more than the window by now: the server
	// has delivered them, the Subscriber has not started them. On a busy
	// machine the next pull may not have come back yet; the window is
	// checked all the same.
	deadline := time.Now().Add(10 * time.Second)
	for consumerInfo(t, c).NumAckPending <= window && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a := active.Load(); a != window {
		t.Fatalf("%d deliveries processed at once, window %d", a, window)
	}
	open()
	waitUntil(t, 15*time.Second, "every message", func() bool { return total.Load() == n })
	if m := peak.Load(); m > window {
		t.Fatalf("peak of %d deliveries at once, window %d", m, window)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestRunSurvivesServerRestart: Run keeps consuming across a restart of
// the server (the client reconnects and pulls again) instead of
// returning, and leaves nothing unsettled.
func TestRunSurvivesServerRestart(t *testing.T) {
	dir := t.TempDir()
	srv, url, err := natsembed.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { natsembed.Shutdown(srv) }()
	nc, js := connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	name := uniqueName()
	if _, err := postboxnats.EnsureStream(context.Background(), js, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	c := ensureConsumer(t, js, name, "c", func(cc *jetstream.ConsumerConfig) { cc.AckWait = time.Second })
	col := &collector{}
	r := runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{Logger: discardLogger()}), col)
	publishMsg(t, js, name+".t", "before", map[string]string{jetstream.MsgIDHeader: "1"})
	waitUntil(t, 10*time.Second, "the first message", func() bool { return len(col.byPayload("before")) == 1 })

	port := srv.Addr().(*net.TCPAddr).Port
	down(t, srv, nc)
	opts := natsembed.DefaultOptions(dir)
	opts.Port = port
	srv, _, err = natsembed.StartOptions(opts)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the client to reconnect", func() bool { return nc.Status() == nats.CONNECTED })
	publishMsg(t, js, name+".t", "after", map[string]string{jetstream.MsgIDHeader: "2"})
	waitUntil(t, 15*time.Second, "a message published after the restart", func() bool { return len(col.byPayload("after")) >= 1 })
	settledAll(t, c)
	if err := r.stop(15 * time.Second); err != nil {
		t.Fatalf("Run: %v", err)
	}
	deleteStream(t, js, name)
}
