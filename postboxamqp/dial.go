package postboxamqp

import (
	"context"
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
// "amqp://guest:guest@127.0.0.1:5672/". The connection is named "postbox"
// in the management UI; use a Dialer of your own for TLS settings,
// another name or other amqp.Config options.
func URL(uri string) Dialer {
	return func(ctx context.Context) (*amqp.Connection, error) {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName("postbox")
		return amqp.DialConfig(uri, amqp.Config{
			Properties: props,
			// The handshake runs under the deadline of ctx (amqp091
			// clears the socket deadline once the connection is open).
			Dial: func(network, addr string) (net.Conn, error) {
				var d net.Dialer
				conn, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				deadline, ok := ctx.Deadline()
				if !ok {
					deadline = time.Now().Add(DefaultDialTimeout)
				}
				if err := conn.SetDeadline(deadline); err != nil {
					_ = conn.Close()
					return nil, err
				}
				return conn, nil
			},
		})
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
