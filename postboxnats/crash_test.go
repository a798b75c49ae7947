package postboxnats_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxnats"
)

func openSQLite(t testing.TB, path string) postboxdriver.Driver[*sql.Tx] { return sqlitetest.DriverAt(t, path) }

// TestInboxCrashLoopIsBounded: a consumer process exits (os.Exit, with the
// handler's transaction open) whenever it runs one poison message. The
// test runs the consumer as a child process of its own binary and starts
// it again after every exit, as a supervisor would. JetStream redelivers
// the poison after AckWait each time; after MaxCrashes counted crashes the
// inbox writes it as a consumer dead message and acks it, and the key's
// next message and every other key's run. On PostgreSQL and on SQLite,
// with the Processor and the BatchProcessor.
func TestInboxCrashLoopIsBounded(t *testing.T) {
	if c, ok := pubtest.CrashChild(t); ok {
		natsCrashChild(t, c)
		return
	}
	eachTarget(t, func(t *testing.T, url string) {
		for _, db := range []string{"postgres", "sqlite"} {
			for _, batch := range []bool{false, true} {
				if batch && url != sharedEmbedded(t) {
					continue // the BatchProcessor once, on the embedded server
				}
				name := db
				if batch {
					name += "_batch"
				}
				t.Run(name, func(t *testing.T) {
					_, js := connect(t, url)
					_, base := stream(t, js, nil)
					c := pubtest.CrashCase{DB: db, Batch: batch, Vars: map[string]string{"url": url, "stream": base}}
					ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
					pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
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
					ackWait := func(long bool) {
						// Long while first deliveries are counted, so that none
						// is redelivered; short for the poison's redeliveries.
						wait := time.Second
						if long {
							wait = time.Minute
						}
						ensureConsumer(t, js, base, pubtest.CrashConsumer, func(cc *jetstream.ConsumerConfig) { cc.AckWait = wait })
					}
					pubtest.CheckCrashLoop(t, ci, c, send, ackWait)
				})
			}
		}
	})
}

// natsCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func natsCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, openSQLite)
	_, js := connect(t, c.Vars["url"])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, c.Vars["stream"], pubtest.CrashConsumer)
	if err != nil {
		t.Fatal(err)
	}
	pubtest.RunCrashChild(t, ci, c, subscriber(t, cons, &postboxnats.SubscriberConfig{PerKey: true}))
}
