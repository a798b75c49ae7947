package postboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxamqp"
)

func TestConfigListsEveryBadField(t *testing.T) {
	_, err := postboxamqp.New(postboxamqp.URL("amqp://x"), &postboxamqp.Config{
		Exchange:            strings.Repeat("x", 300),
		AcceptUnroutable:    []string{"a*b", ""},
		DisableMandatory:    true,
		PublishTimeout:      time.Nanosecond,
		MaxPending:          -1,
		MaxMessageSize:      1 << 30,
		DialTimeout:         time.Millisecond,
		ReconnectBackoff:    -1,
		ReconnectBackoffMax: time.Hour,
	})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New = %v, want a *postbox.ConfigError", err)
	}
	want := []string{"Exchange", "AcceptUnroutable[0]", "AcceptUnroutable[1]", "AcceptUnroutable", "PublishTimeout", "MaxPending", "MaxMessageSize", "DialTimeout", "ReconnectBackoff", "ReconnectBackoffMax"}
	fieldsMatch(t, ce, want)

	_, err = postboxamqp.NewSubscriber(postboxamqp.URL("amqp://x"), "", &postboxamqp.SubscriberConfig{
		Prefetch: 4, MaxInFlight: 8, MaxRetryHold: time.Hour, ReconnectBackoffMax: time.Nanosecond,
	})
	if !errors.As(err, &ce) {
		t.Fatalf("NewSubscriber = %v, want a *postbox.ConfigError", err)
	}
	fieldsMatch(t, ce, []string{"Prefetch", "MaxRetryHold", "ReconnectBackoffMax", "queue"})

	if _, err := postboxamqp.New(nil, nil); err == nil {
		t.Fatal("New without a Dialer succeeded")
	}
	p, err := postboxamqp.New(postboxamqp.URL("amqp://x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Config()
	if c.Exchange != postboxamqp.DefaultExchange || c.DisableMandatory || c.MaxPending != postboxamqp.DefaultMaxPending || c.PublishTimeout != postboxamqp.DefaultPublishTimeout {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestTopologyListsEveryBadField(t *testing.T) {
	err := postboxamqp.EnsureTopology(context.Background(), nil, postboxamqp.Topology{
		Exchange:        "amq.mine",
		Kind:            "fan",
		Bindings:        []string{"a"},
		DeliveryLimit:   -5,
		DeadLetterQueue: "dlq",
		QueueArgs:       amqp.Table{"x-queue-type": "classic"},
	})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("EnsureTopology = %v, want a *postbox.ConfigError", err)
	}
	fieldsMatch(t, ce, []string{"Exchange", "Kind", "Bindings", "DeliveryLimit", "QueueArgs", "DeliveryLimit", "DeadLetterQueue", "QueueArgs"})
}

func fieldsMatch(t *testing.T, ce *postbox.ConfigError, want []string) {
	t.Helper()
	got := map[string]int{}
	for _, p := range ce.Problems {
		got[p.Field]++
	}
	wantN := map[string]int{}
	for _, f := range want {
		wantN[f]++
	}
	if fmt.Sprint(got) != fmt.Sprint(wantN) {
		t.Fatalf("problems %v, want fields %v (%v)", got, wantN, ce)
	}
}

// The message on the wire: persistent, message-id, content-type, the
// CloudEvents attributes as cloudEvents:* headers, timestamp and type.
func TestWireFormat(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"orders.*"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	env := envelope("orders.created", `{"n":1}`)
	env.Key = "order-7"
	env.Headers[postbox.HeaderPartitionKey] = "order-7"
	env.Headers[postbox.HeaderContentType] = "application/json"
	env.Headers["tenant"] = "acme"
	env.CreatedAt = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	if err := publish(t, p, context.Background(), env); err != nil {
		t.Fatal(err)
	}
	d := get(t, conn, x+".q")
	if d.MessageId != env.ID || d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" ||
		d.Type != "orders.created" || !d.Timestamp.Equal(env.CreatedAt) || d.RoutingKey != "orders.created" || string(d.Body) != `{"n":1}` {
		t.Fatalf("properties %+v", d)
	}
	want := amqp.Table{
		"cloudEvents:specversion": "1.0", "cloudEvents:id": env.ID, "cloudEvents:type": "orders.created",
		"cloudEvents:source": "postboxamqp-test", "cloudEvents:partitionkey": "order-7", "tenant": "acme",
	}
	if fmt.Sprint(d.Headers) != fmt.Sprint(want) {
		t.Fatalf("headers %v, want %v", d.Headers, want)
	}
}

func TestUnroutableIsMessageFailure(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x})
	var mu sync.Mutex
	var hooked []string
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{
		Exchange:         x,
		AcceptUnroutable: []string{"audit.*", "metrics"},
		OnUnroutable: func(topic string) {
			mu.Lock()
			hooked = append(hooked, topic)
			mu.Unlock()
		},
	})
	mustMessage(t, publish(t, p, context.Background(), envelope("orders.created", "x")), postboxamqp.ErrUnroutable)
	mustMessage(t, publish(t, p, context.Background(), envelope("metrics.cpu", "x")), postboxamqp.ErrUnroutable)
	if n := p.Unroutable(); n != 0 {
		t.Fatalf("Unroutable = %d after refused messages", n)
	}
	for _, topic := range []string{"audit.login", "metrics"} {
		if err := publish(t, p, context.Background(), envelope(topic, "x")); err != nil {
			t.Fatalf("accepted unroutable topic %s: %v", topic, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := p.Unroutable(); n != 2 || fmt.Sprint(hooked) != "[audit.login metrics]" {
		t.Fatalf("Unroutable = %d, hook saw %v", n, hooked)
	}
}

// Returns come with a message-id, not a delivery tag: pipelined publishes
// to routed and unrouted topics each get their own outcome.
func TestReturnsMatchTheirMessages(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"routed"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	const n = 400
	results := make([]*result, n)
	for i := range n {
		topic := "routed"
		if i%3 == 0 {
			topic = "unrouted"
		}
		results[i] = pubtest.NewResult(t)
		p.Publish(context.Background(), envelope(topic, "x"), results[i].Done)
	}
	routed := 0
	for i, r := range results {
		err := r.Wait(20 * time.Second)
		if i%3 == 0 {
			mustMessage(t, err, postboxamqp.ErrUnroutable)
			continue
		}
		if err != nil {
			t.Fatalf("publish %d to a routed topic: %v", i, err)
		}
		routed++
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(x+".q", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != routed {
		t.Fatalf("queue holds %d messages, %d were confirmed", q.Messages, routed)
	}
}

// Messages AMQP cannot carry fail before they reach the broker.
func TestInvalidMessagesAreMessageFailures(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{
		Exchange:       x,
		MaxMessageSize: 1 << 10,
		RoutingKey: func(topic string) string {
			if topic == "long" {
				return strings.Repeat("k", 256)
			}
			return topic
		},
	})
	ctx := context.Background()
	noID := envelope("t", "x")
	noID.ID = ""
	mustPermanent(t, publish(t, p, ctx, noID), postboxamqp.ErrNoID)
	mustPermanent(t, publish(t, p, ctx, envelope("long", "x")), postboxamqp.ErrInvalidRoutingKey)
	big := envelope("t", strings.Repeat("x", 1<<10+1))
	mustPermanent(t, publish(t, p, ctx, big), postboxamqp.ErrTooLarge)
	for _, h := range []string{"CC", "bcc", "x-delay", "x-death"} {
		env := envelope("t", "x")
		env.Headers[h] = "q"
		mustPermanent(t, publish(t, p, ctx, env), postboxamqp.ErrInvalidHeader)
	}
	// Headers over the connection's frame_max (128 KiB by default).
	wide := envelope("t", "x")
	wide.Headers["blob"] = strings.Repeat("h", 200<<10)
	mustPermanent(t, publish(t, p, ctx, wide), postboxamqp.ErrTooLarge)
	// None of it broke the connection.
	if err := publish(t, p, ctx, envelope("t", "fine")); err != nil {
		t.Fatal(err)
	}
}

// A header frame over frame_max that the Publisher does not stop: the
// broker closes the connection (501 FRAME_ERROR). The first attempt fails
// as infrastructure (the exception names no publish) and makes the message
// a suspect; sent again alone, as the relay does, it is blamed. The
// Publisher reconnects.
func TestBrokerRefusedFrameIsMessageFailure(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	postboxamqp.SkipFrameCheck(p)
	ctx := context.Background()
	if err := publish(t, p, ctx, envelope("t", "first")); err != nil {
		t.Fatal(err)
	}
	wide := envelope("t", "x")
	wide.Headers["blob"] = strings.Repeat("h", 200<<10)
	err := againAfterInfrastructure(t, func() error { return publish(t, p, ctx, wide) })
	mustPermanent(t, err, postboxamqp.ErrRejected)
	var ae *amqp.Error
	if !errors.As(err, &ae) || !ae.Server {
		t.Fatalf("%v does not carry the broker's exception", err)
	}
	t.Logf("broker said: %v", ae)
	if err := publish(t, p, ctx, envelope("t", "after")); err != nil {
		t.Fatalf("publish after the broker closed the connection: %v", err)
	}
}

// A message over the server's max_message_size (128 MiB on RabbitMQ 3.x):
// the broker closes the channel with 406 PRECONDITION_FAILED.
//
// The publish timeout is long: writing 128 MiB under -race on a loaded
// machine can take longer than the default 5 s, and a first attempt that
// times out before the broker's close arrives never sees the 406: the
// message becomes a suspect only when that close comes, and is blamed on
// a later attempt, the first to be alone in flight when the 406 arrives
// (the relay keeps sending it until then; this test counts two).
func TestBrokerRefusedSizeIsMessageFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 128 MiB")
	}
	url := brokerURL(t)
	conn := admin(t, url)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x, MaxMessageSize: 512 << 20, PublishTimeout: 5 * time.Minute})
	env := envelope("t", "")
	env.Payload = make([]byte, 128<<20+1)
	err = againAfterInfrastructure(t, func() error { return publish(t, p, context.Background(), env) })
	mustPermanent(t, err, postboxamqp.ErrRejected)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		t.Fatalf("%v: want the broker's 406", err)
	}
	if err := publish(t, p, context.Background(), envelope("t", "after")); err != nil {
		t.Fatal(err)
	}
}

// When the broker closes the connection over one message while others
// are in flight, none of them is blamed; the culprit's next attempt goes
// alone and is.
func TestSuspectIsBlamedAlone(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x, MaxPending: 64})
	postboxamqp.SkipFrameCheck(p)
	ctx := context.Background()
	if err := publish(t, p, ctx, envelope("t", "connect")); err != nil {
		t.Fatal(err)
	}
	bad := envelope("t", "bad")
	bad.Headers["blob"] = strings.Repeat("h", 200<<10)
	var goods []*postbox.Envelope
	for i := range 40 {
		goods = append(goods, envelope("t", fmt.Sprint(i)))
	}
	round := func(withBad bool) (infra []*postbox.Envelope, badErr error) {
		var rs []*result
		var badR *result
		publishBad := func() {
			badR = pubtest.NewResult(t)
			p.Publish(ctx, bad, badR.Done)
		}
		for i, env := range goods {
			if withBad && i == len(goods)/2 {
				publishBad()
			}
			r := pubtest.NewResult(t)
			rs = append(rs, r)
			p.Publish(ctx, env, r.Done)
		}
		if withBad && len(goods) == 0 {
			publishBad()
		}
		for i, r := range rs {
			err := r.Wait(20 * time.Second)
			if err != nil && postbox.IsMessageError(err) {
				t.Fatalf("a good message was blamed: %v", err)
			}
			if err != nil {
				infra = append(infra, goods[i])
			}
		}
		if badR != nil {
			badErr = badR.Wait(20 * time.Second)
		}
		return infra, badErr
	}
	// The relay sends again whatever failed as infrastructure; the bad
	// message, a suspect after its first failure, goes alone and is
	// blamed. A good message is never blamed (round checks it).
	var badErr error
	withBad := true
	for attempt := 1; withBad; attempt++ {
		if attempt > 4 {
			t.Fatalf("the oversized message was not blamed within 4 rounds (last: %v)", badErr)
		}
		var infra []*postbox.Envelope
		infra, badErr = round(true)
		if badErr == nil {
			t.Fatal("the oversized frame was confirmed")
		}
		t.Logf("round %d: bad message %v; %d good ones failed as infrastructure", attempt, badErr, len(infra))
		goods = infra
		if postbox.IsMessageError(badErr) {
			if attempt == 1 {
				t.Fatalf("blamed on first sight: %v", badErr)
			}
			mustPermanent(t, badErr, postboxamqp.ErrRejected)
			withBad = false
		}
	}
	if infra, _ := round(false); len(infra) > 0 {
		t.Fatalf("%d good messages still failing", len(infra))
	}
}

func TestNackIsInfrastructure(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	// A classic queue: a quorum queue applies its length limit a little
	// late, so the nack would not come at a known publish.
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}, Classic: true,
		QueueArgs: amqp.Table{"x-max-length": int64(1), "x-overflow": "reject-publish"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
	if err := publish(t, p, context.Background(), envelope("t", "1")); err != nil {
		t.Fatal(err)
	}
	mustInfra(t, publish(t, p, context.Background(), envelope("t", "2")), postboxamqp.ErrNacked)
}

// A missing exchange fails every message alike: infrastructure.
func TestMissingExchangeIsInfrastructure(t *testing.T) {
	url := brokerURL(t)
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: uniqueName(), ReconnectBackoff: time.Millisecond, ReconnectBackoffMax: time.Millisecond})
	for range 2 {
		err := publish(t, p, context.Background(), envelope("t", "x"))
		mustInfra(t, err, postboxamqp.ErrNoExchange)
	}
}

// A connection cut while a message awaits its confirm fails it once, as
// infrastructure; the next publish reconnects.
func TestConnectionLostIsInfrastructure(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	px := newProxy(t, "127.0.0.1:5672")
	p := publisher(t, postboxamqp.URL(px.url("guest:guest")), &postboxamqp.Config{Exchange: x})
	ctx := context.Background()
	if err := publish(t, p, ctx, envelope("t", "connect")); err != nil {
		t.Fatal(err)
	}
	px.stall()
	var rs []*result
	for range 10 {
		r := pubtest.NewResult(t)
		rs = append(rs, r)
		p.Publish(ctx, envelope("t", "x"), r.Done)
	}
	px.cut()
	for _, r := range rs {
		mustInfra(t, r.Wait(20*time.Second), postboxamqp.ErrConnectionLost)
	}
	px.flow()
	if err := publish(t, p, ctx, envelope("t", "again")); err != nil {
		t.Fatalf("publish after the connection was lost: %v", err)
	}
	if n := px.acceptCount(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// No confirm within PublishTimeout, or the context ends first: done
// reports it, once, and the confirm that comes later changes nothing.
func TestTimeoutAndCancelAreInfrastructure(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	px := newProxy(t, "127.0.0.1:5672")
	p := publisher(t, postboxamqp.URL(px.url("guest:guest")), &postboxamqp.Config{Exchange: x, PublishTimeout: 200 * time.Millisecond})
	if err := publish(t, p, context.Background(), envelope("t", "connect")); err != nil {
		t.Fatal(err)
	}
	px.stall()
	mustInfra(t, publish(t, p, context.Background(), envelope("t", "late")), postboxamqp.ErrPublishTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	r := pubtest.NewResult(t)
	p.Publish(ctx, envelope("t", "canceled"), r.Done)
	cancel()
	mustInfra(t, r.Wait(5*time.Second), context.Canceled)
	if n := p.Pending(); n != 2 {
		t.Fatalf("Pending = %d, want the 2 unconfirmed publishes", n)
	}
	px.flow()
	// Close waits for the late confirms; none calls done again (result
	// checks at cleanup).
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := p.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if n := p.Pending(); n != 0 {
		t.Fatalf("Pending = %d after Close", n)
	}
	mustInfra(t, publish(t, p, context.Background(), envelope("t", "closed")), postboxamqp.ErrClosed)
}

// Close with confirms outstanding fails them with ErrClosed once its
// context ends.
func TestCloseFailsUnconfirmed(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	px := newProxy(t, "127.0.0.1:5672")
	p := publisher(t, postboxamqp.URL(px.url("guest:guest")), &postboxamqp.Config{Exchange: x})
	if err := publish(t, p, context.Background(), envelope("t", "connect")); err != nil {
		t.Fatal(err)
	}
	px.stall()
	r := pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("t", "stuck"), r.Done)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want the deadline", err)
	}
	px.cut()
	mustInfra(t, r.Wait(10*time.Second), nil)
}

// Dialing is single-flight: publishes that find no connection share one
// dial, and after a failed dial they fail at once until its backoff ends.
func TestReconnectIsSingleFlight(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	px := newProxy(t, "127.0.0.1:5672")

	px.setRefuse(true)
	down := publisher(t, postboxamqp.URL(px.url("guest:guest")), &postboxamqp.Config{Exchange: x, ReconnectBackoff: time.Minute, ReconnectBackoffMax: time.Minute})
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mustInfra(t, publish(t, down, context.Background(), envelope("t", "x")), postboxamqp.ErrNotConnected)
		}()
	}
	wg.Wait()
	if n := px.acceptCount(); n != 1 {
		t.Fatalf("%d dials for 20 publishes, want 1", n)
	}
	start := time.Now()
	mustInfra(t, publish(t, down, context.Background(), envelope("t", "x")), postboxamqp.ErrNotConnected)
	if px.acceptCount() != 1 || time.Since(start) > time.Second {
		t.Fatal("a publish during the backoff dialed again or waited")
	}

	px.setRefuse(false)
	up := publisher(t, postboxamqp.URL(px.url("guest:guest")), &postboxamqp.Config{Exchange: x})
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := publish(t, up, context.Background(), envelope("t", "x")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := px.acceptCount(); n != 2 {
		t.Fatalf("%d connections for 50 concurrent publishes, want 1 more", n-1)
	}
}

// againAfterInfrastructure publishes as the relay does: a first failure
// that is infrastructure is tried once more, and the second outcome
// returned. A message the broker refuses is blamed on that second try,
// once it is a suspect sent alone.
func againAfterInfrastructure(t *testing.T, publish func() error) error {
	t.Helper()
	err := publish()
	if err == nil || postbox.IsMessageError(err) {
		t.Fatalf("first attempt: %v; want an infrastructure failure (a message is never blamed on first sight)", err)
	}
	return publish()
}

// What the publisher could never send is refused when it is written, with
// a *ValidationError, and nothing is written.
func TestWriteRefusesWhatAMQPCannotCarry(t *testing.T) {
	url := brokerURL(t)
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".q", Bindings: []string{"#"}})
	p := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{
		Exchange:       x,
		MaxMessageSize: 1 << 10,
		RoutingKey: func(topic string) string {
			if topic == "long" {
				return strings.Repeat("k", 256)
			}
			return topic
		},
	})
	_, prefix, d := pubtest.Tables(t)
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, m := range []postbox.Message{
		{Topic: "t", Payload: make([]byte, 1<<10+1)},
		{Topic: "long"},
		{Topic: "t", Headers: map[string]string{"x-delay": "5000"}},
		{Topic: "t", Headers: map[string]string{"CC": "other.queue"}},
	} {
		var ve *postbox.ValidationError
		if err := c.Write(ctx, postbox.Message{Topic: "fine"}, m); !errors.As(err, &ve) || ve.Field != "messages[1]" {
			t.Errorf("case %d: err = %v, want a *ValidationError on messages[1]", i, err)
		}
	}
	if st, err := c.Stats(ctx); err != nil || st.Pending != 0 {
		t.Fatalf("stats = %+v, %v: a refused write must write nothing", st, err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "t", Payload: []byte("fits")}); err != nil {
		t.Fatal(err)
	}
}
