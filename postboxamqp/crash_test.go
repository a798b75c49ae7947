package postboxamqp_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxdriver"
)

func openSQLite(t testing.TB, path string) postboxdriver.Driver[*sql.Tx] { return sqlitetest.DriverAt(t, path) }

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
			ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
			pub := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: x})
			send := func(msgs []postbox.Message) []string {
				ids := make([]string, len(msgs))
				for i, m := range msgs {
					env := envelope(m.Topic, string(m.Payload))
					env.Key = m.Key
					env.Headers[postbox.HeaderPartitionKey] = m.Key
					if err := publish(t, pub, context.Background(), env); err != nil {
						t.Fatal(err)
					}
					ids[i] = env.ID
				}
				return ids
			}
			// RabbitMQ redelivers at once when a consumer's connection
			// closes: there is no wait to set.
			pubtest.CheckCrashLoop(t, ci, c, send, nil)
		})
	}
}

// amqpCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func amqpCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
	sub := subscriber(t, c.Vars["url"], c.Vars["queue"], &postboxamqp.SubscriberConfig{PerKey: true, ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 500 * time.Millisecond})
	pubtest.RunCrashChild(t, ci, c, sub)
}
