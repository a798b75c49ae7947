package postboxnats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
)

// BenchmarkSubscriberInbox measures consumption through the inbox: b.N
// messages of 256 bytes, published beforehand to the machine's NATS
// server, each processed in a PostgreSQL transaction that records it in
// the inbox and writes one outbox message as the handler's effect, then
// acked with DoubleAck. msgs/s is the rate from the start of Run to the
// last effect. The database pool is testdb's (pgxpool's default size), so
// the inbox's transactions, not the Subscriber, set the pace:
//
//	go test -run '^$' -bench SubscriberInbox -benchtime=20000x ./postboxnats/
func BenchmarkSubscriberInbox(b *testing.B) {
	for _, perKey := range []bool{false, true} {
		b.Run(fmt.Sprintf("PerKey=%v", perKey), func(b *testing.B) {
			js, base, _ := benchTarget(b)
			pool := testdb.Pool(b)
			prefix := testdb.Prefix(b)
			testdb.DropPrefix(b, pool, prefix)
			db := newInboxDB[pgx.Tx](b, postboxpgx.New(pool), prefix, postbox.Config{})

			payload := make([]byte, benchPayload)
			for i := range b.N {
				m := nats.NewMsg(base + ".bench")
				m.Data = payload
				m.Header.Set(jetstream.MsgIDHeader, postbox.NewID())
				m.Header.Set(postbox.HeaderPartitionKey, fmt.Sprintf("key-%d", i%64))
				if _, err := js.PublishMsgAsync(m); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publishes not acknowledged")
			}

			c := ensureConsumer(b, js, base, "bench", nil)
			inner := db.processor("bench", nil)
			var done atomic.Int64
			all := make(chan struct{})
			p := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
				v := inner.Process(ctx, d)
				if v.Action == postbox.Ack && done.Add(1) == int64(b.N) {
					close(all)
				}
				return v
			})
			b.ResetTimer()
			start := time.Now()
			runSubscriber(b, subscriber(b, c, &postboxnats.SubscriberConfig{PerKey: perKey}), p)
			select {
			case <-all:
			case <-time.After(5 * time.Minute):
				b.Fatalf("%d of %d messages processed", done.Load(), b.N)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
