package postboxamqp_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/tcpproxy"
	"github.com/postbox-go/postbox/postboxamqp"
)

// No ignores: every connection a test opens is closed by its cleanup, and
// Publishers and Subscribers end their goroutines on Close and when Run
// returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testURL is the machine's RabbitMQ; POSTBOX_TEST_AMQP_URL overrides it.
func testURL() string {
	if u := os.Getenv("POSTBOX_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// brokerURL returns testURL, and skips the test when it cannot be
// reached.
func brokerURL(t testing.TB) string {
	t.Helper()
	u := testURL()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := postboxamqp.URL(u)(ctx)
	if err != nil {
		t.Skipf("RabbitMQ at %s is unreachable (%v); set POSTBOX_TEST_AMQP_URL to run against another", u, err)
	}
	_ = conn.Close()
	return u
}

var quiet = slog.New(slog.DiscardHandler)

var nameSeq atomic.Int64

// uniqueName returns a name no other test, process or run uses.
func uniqueName() string {
	return fmt.Sprintf("pbxt.%d.%d.%d", os.Getpid(), time.Now().UnixNano()%1_000_000_000, nameSeq.Add(1))
}

// admin opens a connection for topology and inspection, closed when t
// ends (after the cleanups registered later, which run first).
func admin(t testing.TB, url string) *amqp.Connection {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := postboxamqp.URL(url)(ctx)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// ensure declares top and deletes what it declared when t ends.
func ensure(t testing.TB, conn *amqp.Connection, top postboxamqp.Topology) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := postboxamqp.EnsureTopology(ctx, conn, top); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := conn
		if c.IsClosed() { // a test restarted the broker
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			if c, err = postboxamqp.URL(testURL())(ctx); err != nil {
				t.Logf("cleanup: %v", err)
				return
			}
			defer c.Close()
		}
		ch, err := c.Channel()
		if err != nil {
			t.Logf("cleanup: %v", err)
			return
		}
		defer ch.Close()
		for _, q := range []string{top.Queue, top.DeadLetterQueue} {
			if q != "" {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Logf("delete queue %s: %v", q, err)
					return
				}
			}
		}
		for _, x := range []string{top.Exchange, top.DeadLetterExchange} {
			if x != "" {
				if err := ch.ExchangeDelete(x, false, false); err != nil {
					t.Logf("delete exchange %s: %v", x, err)
					return
				}
			}
		}
	})
}

func publisher(t testing.TB, dial postboxamqp.Dialer, cfg *postboxamqp.Config) *postboxamqp.Publisher {
	t.Helper()
	c := postboxamqp.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = quiet
	}
	p, err := postboxamqp.New(dial, &c)
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

// result is one publish's outcome.
type result = pubtest.Result

// publish publishes env and returns its outcome.
func publish(t testing.TB, p *postboxamqp.Publisher, ctx context.Context, env *postbox.Envelope) error {
	t.Helper()
	return pubtest.Publish(t, ctx, p, env, 20*time.Second)
}

func envelope(topic, payload string) *postbox.Envelope {
	id := postbox.NewID()
	return &postbox.Envelope{
		ID: id, Topic: topic, Payload: []byte(payload),
		Headers: map[string]string{
			postbox.HeaderSpecVersion: "1.0", postbox.HeaderID: id, postbox.HeaderType: topic,
			postbox.HeaderSource: "postboxamqp-test",
		},
		CreatedAt: time.Now(), Attempt: 1,
	}
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

// get takes one message from queue, waiting a bounded time for it.
func get(t testing.TB, conn *amqp.Connection, queue string) amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ds:
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatalf("no message in %s within 10s", queue)
		return amqp.Delivery{}
	}
}

// proxy is a TCP proxy to the broker for fault injection: it can stall
// (hold every byte in both directions), cut every connection, and refuse
// new ones.
type proxy struct {
	*tcpproxy.Proxy
	lift func() // set while stalled
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	tp, err := tcpproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.Close)
	return &proxy{Proxy: tp}
}

// url returns brokerURL with the host replaced by the proxy's address.
func (p *proxy) url(user string) string {
	return fmt.Sprintf("amqp://%s@%s/", user, p.Addr())
}

// stall holds every byte from now on, until flow.
func (p *proxy) stall() {
	if p.lift == nil {
		p.lift = p.Blackhole()
	}
}

func (p *proxy) flow() {
	if p.lift != nil {
		p.lift()
		p.lift = nil
	}
}

// cut resets every proxied connection, as a network failure would.
func (p *proxy) cut() { p.Reset() }

// setRefuse makes the proxy close new connections at once (a broker
// that is down), or accept them again.
func (p *proxy) setRefuse(on bool) { p.Refuse(on) }

func (p *proxy) acceptCount() int { return p.Accepts() }
