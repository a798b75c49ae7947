package postboxamqp

import (
	"context"
	"maps"
	"math/rand/v2"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Dialer opens a new connection to RabbitMQ. Publishers and Subscribers
// own the connections they dial: each dials its own, again after every
// loss, and closes it when done. ctx bounds the attempt, handshake
// included.
type Dialer func(ctx context.Context) (*amqp.Connection, error)

// URL returns a Dialer for an AMQP URI such as
// "amqp://guest:guest@127.0.0.1:5672/", the connection named "postbox" in
// the management UI. DialConfig takes amqp.Config options of your own.
func URL(uri string) Dialer {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("postbox")
	return DialConfig(uri, amqp.Config{Properties: props})
}

// DialConfig returns a Dialer for an AMQP URI with amqp.Config options of
// your own: TLS, SASL, heartbeat, client properties. The socket comes
// from cfg.Dial when it is set, else from a net.Dialer under the
// Dialer's context. Either way the handshake runs under the deadline of
// that context (DefaultDialTimeout when it has none), and the
// connection's writes are batched: amqp091 writes every publish to the
// socket on its own, one system call each, and what is written while the
// socket is busy goes out together in the next one (a lone write goes out
// at once). Under load that saves most of those calls, in this process
// and in the broker's.
func DialConfig(uri string, cfg amqp.Config) Dialer {
	return func(ctx context.Context) (*amqp.Connection, error) {
		c := cfg
		// amqp091 writes its capabilities into the properties it is given.
		c.Properties = maps.Clone(cfg.Properties)
		var socket *batchConn
		c.Dial = func(network, addr string) (net.Conn, error) {
			var conn net.Conn
			var err error
			if cfg.Dial != nil {
				conn, err = cfg.Dial(network, addr)
			} else {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
			}
			if err != nil {
				return nil, err
			}
			// amqp091 clears the socket's deadline once the connection
			// is open.
			deadline, ok := ctx.Deadline()
			if !ok {
				deadline = time.Now().Add(DefaultDialTimeout)
			}
			if err := conn.SetDeadline(deadline); err != nil {
				_ = conn.Close()
				return nil, err
			}
			socket = newBatchConn(conn)
			return socket, nil
		}
		conn, err := amqp.DialConfig(uri, c)
		if err != nil && socket != nil {
			// amqp091 leaves the socket of a failed handshake open.
			_ = socket.Close()
		}
		return conn, err
	}
}

// backoff returns the pause after the n-th consecutive failure (n ≥ 1):
// base·2^(n-1) capped at maxDelay, with equal jitter.
func backoff(n int, base, maxDelay time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < maxDelay; i++ {
		d *= 2
	}
	d = min(d, maxDelay)
	half := d / 2
	return half + rand.N(half+1) //nolint:gosec // jitter, not security
}

// closeWait bounds the wait for the broker's close-ok.
const closeWait = 2 * time.Second

// closeConn closes conn without waiting long for a broker that does not
// answer.
func closeConn(conn *amqp.Connection) {
	closeConnBy(conn, time.Now().Add(closeWait))
}

// closeConnBy closes conn, waiting for the broker's close-ok until
// deadline at most.
func closeConnBy(conn *amqp.Connection, deadline time.Time) {
	if conn != nil && !conn.IsClosed() {
		_ = conn.CloseDeadline(deadline)
	}
}
