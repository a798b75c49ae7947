package postboxnats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/postboxnats"
)

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
					ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
					pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
					ackWait := func(long bool) {
						// Long while first deliveries are counted, so that none
						// is redelivered; short for the poison's redeliveries.
						wait := time.Second
						if long {
							wait = time.Minute
						}
						ensureConsumer(t, js, base, pubtest.CrashConsumer, func(cc *jetstream.ConsumerConfig) { cc.AckWait = wait })
					}
					pubtest.CheckCrashLoop(t, ci, c, pub, func(m postbox.Message) *postbox.Envelope { return envelope(m.Topic, string(m.Payload)) }, ackWait)
				})
			}
		}
	})
}

// natsCrashChild is the consuming process of TestInboxCrashLoopIsBounded.
func natsCrashChild(t *testing.T, c pubtest.CrashCase) {
	ci := pubtest.OpenCrashInbox(t, &c, sqlitetest.DriverAt)
	_, js := connect(t, c.Vars["url"])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, c.Vars["stream"], pubtest.CrashConsumer)
	if err != nil {
		t.Fatal(err)
	}
	pubtest.RunCrashChild(t, ci, c, subscriber(t, cons, &postboxnats.SubscriberConfig{PerKey: true}))
}
