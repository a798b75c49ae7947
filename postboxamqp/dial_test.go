package postboxamqp_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox/postboxamqp"
)

// TestDialConfig: DialConfig opens its sockets through the config's Dial,
// leaves the caller's properties as they were, and its connections carry
// publishes; the socket of a handshake that fails is closed by the time
// the dial returns, and a refused login fails the dial.
func TestDialConfig(t *testing.T) {
	u := brokerURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("postbox-dialconfig-test")
	var dials atomic.Int32
	dial := postboxamqp.DialConfig(u, amqp.Config{Properties: props, Dial: func(network, addr string) (net.Conn, error) {
		dials.Add(1)
		return net.DialTimeout(network, addr, 5*time.Second)
	}})
	q := uniqueName()
	for i := range 2 {
		conn, err := dial(ctx)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		var confirms []*amqp.DeferredConfirmation
		for j := range 100 {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte{byte(j)}})
			if err != nil {
				t.Fatal(err)
			}
			confirms = append(confirms, dc)
		}
		for _, dc := range confirms {
			if ok, err := dc.WaitContext(ctx); !ok || err != nil {
				t.Fatalf("publish %d not confirmed: %v", dc.DeliveryTag, err)
			}
		}
		got, err := ch.QueueDeclarePassive(q, false, true, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := 100 * (i + 1); got.Messages != want {
			t.Fatalf("the queue holds %d messages, want %d", got.Messages, want)
		}
		if i == 1 {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("the config's Dial opened %d sockets, want 2", n)
	}
	if _, ok := props["capabilities"]; ok {
		t.Fatal("DialConfig let amqp091 write into the caller's properties")
	}

	// A handshake that fails on the client's side (no SASL mechanism the
	// broker offers): amqp091 returns and leaves the socket open, the
	// broker waiting for an answer; DialConfig closes it before it returns.
	var sock *closeCounting
	_, err := postboxamqp.DialConfig(u, amqp.Config{
		SASL: []amqp.Authentication{noSuchMechanism{}},
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			sock = &closeCounting{Conn: c}
			return sock, nil
		},
	})(ctx)
	if !errors.Is(err, amqp.ErrSASL) {
		t.Fatalf("dial with no common SASL mechanism: %v, want amqp.ErrSASL", err)
	}
	if sock == nil || sock.closes.Load() == 0 {
		t.Fatal("the socket of the failed handshake was left open")
	}

	bad, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	bad.User = url.UserPassword("postbox-no-such-user", "wrong")
	if conn, err := postboxamqp.DialConfig(bad.String(), amqp.Config{})(ctx); err == nil {
		_ = conn.Close()
		t.Fatal("a dial with wrong credentials succeeded")
	}
}

type noSuchMechanism struct{}

func (noSuchMechanism) Mechanism() string { return "POSTBOX-NO-SUCH-MECHANISM" }
func (noSuchMechanism) Response() string  { return "" }

// closeCounting counts the Close calls on a socket.
type closeCounting struct {
	net.Conn
	closes atomic.Int32
}

func (c *closeCounting) Close() error {
	c.closes.Add(1)
	return c.Conn.Close()
}

// TestDialConfigBatchesWrites: on a connection DialConfig made, publishes
// do not wait for the socket. With the socket's writes held shut after the
// handshake, 50 publishes return, and once it opens they reach it in one
// write (beside the one that was held, if the sender had got that far),
// and are confirmed.
func TestDialConfigBatchesWrites(t *testing.T) {
	u := brokerURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sock *heldConn
	conn, err := postboxamqp.DialConfig(u, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		sock = &heldConn{Conn: c}
		return sock, nil
	}})(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare(uniqueName(), false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}

	open := sock.hold()
	defer open() // a failure below must not leave a writer stuck
	const n = 50
	published := make(chan []*amqp.DeferredConfirmation, 1)
	go func() {
		var dcs []*amqp.DeferredConfirmation
		for j := range n {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q.Name, false, false, amqp.Publishing{Body: []byte{byte(j)}})
			if err != nil {
				t.Error(err)
				break
			}
			dcs = append(dcs, dc)
		}
		published <- dcs
	}()
	var dcs []*amqp.DeferredConfirmation
	select {
	case dcs = <-published:
	case <-time.After(10 * time.Second):
		t.Fatal("the publishes waited for the socket that was held: its writes are not batched")
	}
	open()
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish %d not confirmed: %v", dc.DeliveryTag, err)
		}
	}
	// The held write, if the sender had reached the socket before it
	// opened, and one with everything queued behind it: nothing else
	// writes meanwhile (a heartbeat only after seconds without a write).
	if w := sock.writes.Load(); len(dcs) != n || w < 1 || w > 2 {
		t.Fatalf("%d publishes reached the socket in %d writes from the hold to their confirms", len(dcs), w)
	}
}

// heldConn is a socket whose writes can be held until it is opened again.
type heldConn struct {
	net.Conn
	mu       sync.Mutex
	gate     chan struct{} // nil: writes go through
	counting bool          // a hold was made: writes are counted from then on
	writes   atomic.Int32
}

// hold holds the socket's writes until the returned open is called, and
// counts them from now on.
func (c *heldConn) hold() (open func()) {
	gate := make(chan struct{})
	c.mu.Lock()
	c.gate, c.counting = gate, true
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.gate = nil
			c.mu.Unlock()
			close(gate)
		})
	}
}

func (c *heldConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	gate, counting := c.gate, c.counting
	c.mu.Unlock()
	if counting {
		c.writes.Add(1)
	}
	if gate != nil {
		<-gate
	}
	return c.Conn.Write(p)
}
