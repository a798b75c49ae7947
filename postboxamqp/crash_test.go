package postboxamqp_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxamqp"
)

// TestInboxCrashLoopIsBounded: a consumer process exits (os.Exit, with the
// handler's transaction open) whenever it runs one poison message. The
// test runs the consumer as a child process of its own binary and starts
// it again after every exit, as a supervisor would. The quorum queue gets
// the unacknowledged poison back when the child's connection closes and
// counts it (x-delivery-count); after MaxCrashes counted crashes the inbox
// writes it as a consumer dead message, and the key's next message and
// every other key's run. On PostgreSQL and on SQLite.
func TestInboxCrashLoopIsBounded(t *testing.T) {
	if c, ok := pubtest.CrashChild(t); ok {
		amqpCrashChild(t, c)
		return
	}
	url := brokerURL(t)
	for _, db := range []string{"postgres", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			x := uniqueName()
			ensure(t, admin(t, url), postboxamqp.Topology{Exchange: x, Queue: x + ".billing", Bindings: []string{"orders.*"}})
			c := pubtest.CrashCase{DB: db, Vars: map[string]string{"url": url, "queue": x + ".billing"}}
			ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
			pub := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
			// RabbitMQ redelivers at once when a consumer's connection
			// closes: there is no wait to set.
			pubtest.CheckCrashLoop(t, ci, c, pub, func(m postbox.Message) *postbox.Envelope { return envelope(m.Topic, string(m.Payload)) }, nil)
		})
	}
}

// amqpCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func amqpCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
	sub := subscriber(t, c.Vars["url"], c.Vars["queue"], &postboxamqp.SubscriberConfig{PerKey: true, ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 500 * time.Millisecond})
	pubtest.RunCrashChild(t, ci, c, sub)
}
