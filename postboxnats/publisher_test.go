package postboxnats_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/tcpproxy"
	"github.com/postbox-go/postbox/postboxnats"
)

func TestPublishAckHeadersAndPayload(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})

		env := envelope("orders.created", `{"order":42}`)
		env.Key = "order-42"
		env.Headers[postbox.HeaderID] = env.ID
		env.Headers[postbox.HeaderContentType] = "application/json"
		env.Headers[postbox.HeaderPartitionKey] = env.Key
		env.Headers["traceparent"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		if err := publish(t, p, ctx, env); err != nil {
			t.Fatalf("publish: %v", err)
		}
		if n := p.Pending(); n != 0 {
			t.Fatalf("Pending() = %d after the ack, want 0", n)
		}

		msg, err := s.GetMsg(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := base + ".orders.created"; msg.Subject != want {
			t.Errorf("subject %q, want %q", msg.Subject, want)
		}
		if string(msg.Data) != `{"order":42}` {
			t.Errorf("payload %q", msg.Data)
		}
		if got := msg.Header.Get(jetstream.MsgIDHeader); got != env.ID {
			t.Errorf("Nats-Msg-Id %q, want %q", got, env.ID)
		}
		for k, v := range env.Headers {
			if got := msg.Header.Get(k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
	})
}

func TestDuplicateIDStoredOnce(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})

		env := envelope("dedupe", "first")
		if err := publish(t, p, ctx, env); err != nil {
			t.Fatal(err)
		}
		again := *env
		again.Payload = []byte("second")
		again.Attempt = 2
		// The retry's ack has Duplicate set; it counts as success.
		if err := publish(t, p, ctx, &again); err != nil {
			t.Fatalf("duplicate publish: %v", err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 1 {
			t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
		}
		msg, err := s.GetMsg(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if string(msg.Data) != "first" {
			t.Fatalf("stored %q, want the first copy", msg.Data)
		}
	})
}

func TestSubjectMapping(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)

		custom := publisher(t, js, &postboxnats.Config{Subject: func(topic string) string {
			return base + ".custom." + strings.ReplaceAll(topic, ":", ".")
		}})
		if err := publish(t, custom, ctx, envelope("billing:invoice.paid", "x")); err != nil {
			t.Fatal(err)
		}
		msg, err := s.GetMsg(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := base + ".custom.billing.invoice.paid"; msg.Subject != want {
			t.Fatalf("subject %q, want %q", msg.Subject, want)
		}

		for _, bad := range []string{"", base + "..x", base + ".*", base + ".>", base + ".a b", "$JS.API.STREAM.DELETE." + base, strings.Repeat("a", postboxnats.MaxSubjectBytes+1)} {
			p := publisher(t, js, &postboxnats.Config{Subject: func(string) string { return bad }})
			if _, err := p.Subject("t"); !errors.Is(err, postboxnats.ErrInvalidSubject) {
				t.Errorf("Subject() for %q: %v, want ErrInvalidSubject", bad, err)
			}
			err := publish(t, p, ctx, envelope("t", "x"))
			mustPermanent(t, err, postboxnats.ErrInvalidSubject)
		}
		// A valid topic can still make an invalid subject, every time
		// (the subjects kept are valid ones only), and a prefix's
		// subject is the same when asked again.
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		for range 2 {
			mustPermanent(t, publish(t, p, ctx, envelope("a..b", "x")), postboxnats.ErrInvalidSubject)
			if got, err := p.Subject("orders"); err != nil || got != base+".orders" {
				t.Fatalf("Subject(orders) = %q, %v", got, err)
			}
		}
		// A Subject function is asked each time.
		calls := 0
		counted := publisher(t, js, &postboxnats.Config{Subject: func(topic string) string { calls++; return base + "." + topic }})
		for range 3 {
			if _, err := counted.Subject("orders"); err != nil {
				t.Fatal(err)
			}
		}
		if calls != 3 {
			t.Fatalf("Subject function called %d times for 3 subjects, want 3", calls)
		}

		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 1 {
			t.Fatalf("stream holds %d messages, want only the valid one", info.State.Msgs)
		}
	})
}

func TestNoStreamIsMessageFailure(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		_, js := connect(t, url)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: uniqueName() + "."})
		// Several at once share one stream lookup.
		var rs []*result
		for i := 0; i < 20; i++ {
			r := pubtest.NewResult(t)
			p.Publish(context.Background(), envelope("nowhere", "x"), r.Done)
			rs = append(rs, r)
		}
		for _, r := range rs {
			mustMessage(t, r.Wait(15*time.Second), postboxnats.ErrNoStream)
		}
	})
}

// TestNoJetStreamIsInfrastructure: a server without JetStream gives no
// responders both to the publish and to the stream lookup. The lookup
// cannot say whether a stream exists, so the message is not blamed.
func TestNoJetStreamIsInfrastructure(t *testing.T) {
	srv, url, err := natsembed.StartOptions(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT})
	if err != nil {
		t.Fatal(err)
	}
	defer natsembed.Shutdown(srv)
	_, js := connect(t, url)
	p := publisher(t, js, &postboxnats.Config{PublishTimeout: time.Second})
	err = publish(t, p, context.Background(), envelope("orders", "x"))
	mustInfra(t, err)
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("got %v, want it to wrap ErrNoStreamResponse", err)
	}
}

func TestOversizePayload(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		nc, js := connect(t, url)
		s, base := stream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})

		// Over the server's max_payload: refused by the client.
		huge := envelope("big", strings.Repeat("x", int(nc.MaxPayload())+1))
		mustPermanent(t, publish(t, p, ctx, huge), nats.ErrMaxPayload)

		// Under max_payload, over the stream's max_msg_size: refused by
		// JetStream in the PubAck.
		err := publish(t, p, ctx, envelope("big", strings.Repeat("x", 2048)))
		mustPermanent(t, err, jetstream.ErrStreamMessageExceedsMaximum)

		if err := publish(t, p, ctx, envelope("small", "fits")); err != nil {
			t.Fatalf("a message that fits: %v", err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 1 {
			t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
		}
		if p.Pending() != 0 {
			t.Fatalf("Pending() = %d, want 0", p.Pending())
		}
	})
}

func TestInvalidHeadersAndID(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		for name, value := range map[string]string{
			"Nats-Rollup":    "all",
			"nats-msg-id":    "other",
			"bad name":       "v",
			"colon:name":     "v",
			"x-injected":     "v\r\nNats-Rollup: all",
			"x-with-newline": "a\nb",
		} {
			env := envelope("h", "x")
			env.Headers[name] = value
			mustPermanent(t, publish(t, p, ctx, env), postboxnats.ErrInvalidHeader)
		}
		env := envelope("h", "x")
		env.ID = ""
		mustPermanent(t, publish(t, p, ctx, env), postboxnats.ErrNoID)
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 0 {
			t.Fatalf("stream holds %d messages, want 0", info.State.Msgs)
		}
	})
}

func TestExpectStream(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		right := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", ExpectStream: base})
		if err := publish(t, right, ctx, envelope("x", "ok")); err != nil {
			t.Fatal(err)
		}
		wrong := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", ExpectStream: "SOMEWHERE_ELSE"})
		err := publish(t, wrong, ctx, envelope("x", "no"))
		mustMessage(t, err, nil)
		var api *jetstream.APIError
		if !errors.As(err, &api) || api.ErrorCode != 10060 {
			t.Fatalf("got %v, want API error 10060 (expected stream does not match)", err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 1 {
			t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
		}
	})
}

func TestContextEnds(t *testing.T) {
	t.Run("before publish", func(t *testing.T) {
		_, js := connect(t, sharedEmbedded(t))
		_, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := publish(t, p, ctx, envelope("x", "x"))
		mustInfra(t, err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
	})

	// While awaiting the ack: the server is gone (the client keeps
	// reconnecting and buffers the publish), so no ack can come before
	// the context ends.
	t.Run("awaiting the ack", func(t *testing.T) {
		srv, url, err := natsembed.Start(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer natsembed.Shutdown(srv)
		nc, js := connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		_, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", PublishTimeout: time.Minute, MaxPending: 1})
		if err := publish(t, p, context.Background(), envelope("x", "warm-up")); err != nil {
			t.Fatal(err)
		}
		down(t, srv, nc)

		ctx, cancel := context.WithCancel(context.Background())
		r := pubtest.NewResult(t)
		p.Publish(ctx, envelope("x", "stuck"), r.Done)
		pending := p.Pending()
		cancel()
		err = r.Wait(5 * time.Second)
		if err == nil || postbox.IsMessageError(err) {
			t.Fatalf("got %v, want an infrastructure failure", err)
		}
		if !errors.Is(err, context.Canceled) {
			// The client may refuse the publish at once while it is
			// disconnected, before the context ends: also infrastructure,
			// and then nothing holds a slot.
			t.Skipf("the client refused the publish while disconnected (%v): the full-window check did not run", err)
		}
		if pending != 1 {
			t.Fatalf("Pending() = %d while awaiting the ack, want 1", pending)
		}
		// The abandoned publish keeps its slot until it is settled; with
		// the window full, the next Publish waits for its context. The
		// disconnected client may settle it first, failing the ack it
		// can no longer get, and then the slot is free, as it should be.
		if n := p.Pending(); n != 1 {
			if n != 0 {
				t.Fatalf("Pending() = %d after the context ended, want 1 (or 0 once settled)", n)
			}
			t.Skip("the client settled the abandoned publish before the check: the full-window check did not run")
		}
		short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel2()
		err = publish(t, p, short, envelope("x", "blocked"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
	})
}

// down shuts srv down and waits until nc has noticed.
func down(t testing.TB, srv *server.Server, nc *nats.Conn) {
	t.Helper()
	if err := downErr(srv, nc); err != nil {
		t.Fatal(err)
	}
}

func downErr(srv *server.Server, nc *nats.Conn) error {
	gone := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	defer nc.RemoveStatusListener(gone)
	natsembed.Shutdown(srv)
	select {
	case <-gone:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("client did not notice the server shut down")
	}
}

// TestServerShutdown: every publish in flight when the server goes, and
// every publish after, is reported once, as an infrastructure failure or
// (for those acked in time) a success; never as a message failure.
func TestServerShutdown(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []nats.Option
	}{
		{"reconnecting", []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}},
		{"closed", []nats.Option{nats.MaxReconnects(0)}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			srv, url, err := natsembed.Start(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer natsembed.Shutdown(srv)
			nc, js := connect(t, url, mode.opts...)
			_, base := stream(t, js, nil)
			p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", PublishTimeout: 500 * time.Millisecond, MaxPending: 256})

			const before, after = 500, 20
			var wg sync.WaitGroup
			var mu sync.Mutex
			var acked, infra int
			record := func(err error) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					acked++
				case postbox.IsMessageError(err):
					t.Errorf("message failure on shutdown: %v", err)
				default:
					infra++
				}
			}
			var rs []*result
			ctx := context.Background()
			for i := 0; i < before; i++ {
				if i == before/5 {
					// Some acks are in by now, most publishes are not.
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := downErr(srv, nc); err != nil {
							t.Error(err)
						}
					}()
				}
				r := pubtest.NewResult(t)
				rs = append(rs, r)
				p.Publish(ctx, envelope("x", "in flight"), r.Done)
			}
			wg.Wait()
			for i := 0; i < after; i++ {
				r := pubtest.NewResult(t)
				rs = append(rs, r)
				p.Publish(ctx, envelope("x", "after"), r.Done)
			}
			for _, r := range rs {
				record(r.Wait(15 * time.Second))
			}
			if infra < after {
				t.Fatalf("%d infrastructure failures, want at least the %d publishes after the shutdown", infra, after)
			}
			t.Logf("%d acked, %d infrastructure failures", acked, infra)
			if n := p.Pending(); n != 0 {
				t.Fatalf("Pending() = %d once all settled, want 0", n)
			}
		})
	}
}

// TestClose: Close fails what still awaits its ack with ErrClosed, and
// every Publish after it. The broker is cut off by a proxy that holds all
// traffic, so the publish stays in flight until Close: a server that shuts
// down instead would have the client fail in-flight publishes itself
// (nats.ErrDisconnected, from its own reconnect watcher), at a moment no
// test can order against Close.
func TestClose(t *testing.T) {
	srv, url, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the stream is deleted through the proxy,
	// which then closes, before the server shuts down.
	t.Cleanup(func() { natsembed.Shutdown(srv) })
	proxy, err := tcpproxy.New(strings.TrimPrefix(url, "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	_, js := connect(t, "nats://"+proxy.Addr())
	_, base := stream(t, js, nil)
	p, err := postboxnats.New(js, &postboxnats.Config{SubjectPrefix: base + ".", PublishTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := publish(t, p, context.Background(), envelope("x", "ok")); err != nil {
		t.Fatal(err)
	}
	lift := proxy.Blackhole()
	defer lift()
	r := pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("x", "stuck"), r.Done)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	err = r.Wait(5 * time.Second)
	mustInfra(t, err)
	if !errors.Is(err, postboxnats.ErrClosed) {
		t.Fatalf("in-flight publish got %v, want ErrClosed", err)
	}
	err = publish(t, p, context.Background(), envelope("x", "late"))
	if !errors.Is(err, postboxnats.ErrClosed) {
		t.Fatalf("publish after Close got %v, want ErrClosed", err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestManyInFlight pushes far more messages than the window from several
// goroutines, as the relay's lanes do, and checks every one is
// acknowledged once and stored once.
func TestManyInFlight(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		s, base := stream(t, js, nil)
		p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", MaxPending: 32})
		const lanes, n = 4, 3000
		rs := make([]*result, n)
		for i := range rs {
			rs[i] = pubtest.NewResult(t)
		}
		var wg sync.WaitGroup
		for l := 0; l < lanes; l++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := l; i < n; i += lanes {
					p.Publish(ctx, envelope("many", "x"), rs[i].Done)
					if p.Pending() > 32 {
						t.Errorf("Pending() = %d, over MaxPending", p.Pending())
						return
					}
				}
			}()
		}
		wg.Wait()
		for _, r := range rs {
			if err := r.Wait(15 * time.Second); err != nil {
				t.Fatal(err)
			}
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != n {
			t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, n)
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, js := connect(t, sharedEmbedded(t))
	_, err := postboxnats.New(js, &postboxnats.Config{
		SubjectPrefix:  "no-dot",
		ExpectStream:   "has.dot",
		PublishTimeout: time.Microsecond,
		MaxPending:     -1,
	})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want *postbox.ConfigError", err)
	}
	fields := map[string]bool{}
	for _, p := range ce.Problems {
		fields[p.Field] = true
	}
	for _, f := range []string{"SubjectPrefix", "ExpectStream", "PublishTimeout", "MaxPending"} {
		if !fields[f] {
			t.Errorf("%s not reported in %v", f, err)
		}
	}
	if _, err := postboxnats.New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestEnsureStream(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		name := uniqueName()
		t.Cleanup(func() { deleteStream(t, js, name) })
		cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Duplicates: 2 * time.Minute}
		if _, err := postboxnats.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := postboxnats.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatalf("second EnsureStream: %v", err)
		}
		cfg.MaxAge = time.Hour
		s, err := postboxnats.EnsureStream(ctx, js, cfg)
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.MaxAge != time.Hour || info.Config.Duplicates != 2*time.Minute {
			t.Fatalf("config not applied: max age %s, duplicates %s", info.Config.MaxAge, info.Config.Duplicates)
		}
		if _, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: uniqueName()}); err == nil {
			t.Fatal("EnsureStream without subjects succeeded")
		}
	})
}

// TestDonePublishesAgain: a done that publishes again (a caller chaining a
// key's next message) must not deadlock, whichever client goroutine runs
// it: here the ack timer's, which holds the client's publisher lock.
func TestDonePublishesAgain(t *testing.T) {
	srv, url, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer natsembed.Shutdown(srv)
	nc, js := connect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	_, base := stream(t, js, nil)
	p := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + ".", PublishTimeout: 100 * time.Millisecond})
	if err := publish(t, p, context.Background(), envelope("x", "ok")); err != nil {
		t.Fatal(err)
	}
	down(t, srv, nc)
	// A publish in flight when the client's reconnect watcher sees the
	// disconnect fails with nats.ErrDisconnected; once one has timed out
	// instead, the watcher is done and the next ones time out too.
	for i := 0; ; i++ {
		err := publish(t, p, context.Background(), envelope("x", "probe"))
		if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			break
		}
		if i == 20 {
			t.Fatalf("no ack timeout after %d publishes, last: %v", i, err)
		}
	}
	second := pubtest.NewResult(t)
	first := pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("x", "first"), func(err error) {
		first.Done(err)
		p.Publish(context.Background(), envelope("x", "second"), second.Done)
	})
	for _, r := range []*result{first, second} {
		if err := r.Wait(5 * time.Second); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("got %v, want an ack timeout", err)
		}
	}
}

// What the publisher could never send is refused when it is written, with
// a *ValidationError, and nothing is written: topics whose subject has an
// empty token, keys that cannot travel in a header, a payload over the
// server's max_payload. What only the server can tell (a stream's
// max_msg_size) is dead on its first publish instead of spending the
// budget.
func TestWriteRefusesWhatNATSCannotCarry(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		nc, js := connect(t, url)
		s, base := stream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		_, prefix, d := pubtest.Tables(t)
		c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, MaxAttempts: 25,
			Logger: slog.New(slog.DiscardHandler), MaxPayloadBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		huge := make([]byte, nc.MaxPayload()) // with its headers, over max_payload
		for i, m := range []postbox.Message{
			{Topic: "a..b"}, {Topic: ".a"}, {Topic: "a."},
			{Topic: "ok", Key: "line\nbreak"}, {Topic: "ok", Key: "carriage\rreturn"},
			{Topic: "ok", Payload: huge},
		} {
			err := c.Write(ctx, postbox.Message{Topic: "fine"}, m)
			var ve *postbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != "messages[1]" {
				t.Errorf("case %d (topic %q, key %q, %d bytes): err = %v, want a *ValidationError on messages[1]", i, m.Topic, m.Key, len(m.Payload), err)
			}
		}
		if st, err := c.Stats(ctx); err != nil || st.Pending != 0 {
			t.Fatalf("stats = %+v, %v: a refused write must write nothing", st, err)
		}
		// Over the stream's max_msg_size, which the writer cannot know:
		// dead on the first attempt.
		if err := c.Write(ctx, postbox.Message{Topic: "big", Payload: make([]byte, 8192)}, postbox.Message{Topic: "small"}); err != nil {
			t.Fatal(err)
		}
		res, err := c.Drain(ctx)
		if err != nil || res.Dead != 1 || res.Failed != 1 || res.Published != 1 {
			t.Fatalf("Drain = %+v, %v; want the large one dead on its first attempt", res, err)
		}
		dead, err := c.Admin().ListDead(ctx, postbox.DeadFilter{Topic: "big"})
		if err != nil || len(dead) != 1 || dead[0].Attempts != 1 {
			t.Fatalf("dead = %+v, %v", dead, err)
		}
		if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
			t.Fatalf("stream = %+v, %v", info, err)
		}
	})
}
