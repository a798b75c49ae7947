package postboxamqp_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxbrokertest"
)

// suiteConsumers are the consumer names the broker suite subscribes with.
// In RabbitMQ a consumer name is a queue, and a queue keeps only what was
// routed to it while it existed; the suite publishes before it subscribes,
// so each test's queues are declared up front, one per name.
var suiteConsumers = []string{"c", "c1", "c2", "shared"}

// features declares what RabbitMQ offers the suite:
//
//   - NativeDedupe: no. RabbitMQ stores every publish; a re-sent message
//     is a copy, and the consumers' inbox absorbs it.
//   - DelayedRedelivery: yes. The Subscriber holds a delivery for the
//     Retry's delay (up to MaxRetryHold) before requeueing it.
//   - OrderPerKey: no. A requeued delivery, a connection loss and
//     competing consumers all reorder a key's messages (package doc).
//   - RejectsUnroutable: yes. mandatory makes the broker return a message
//     no queue is bound for, before confirming it.
var features = postboxbrokertest.Features{
	NativeDedupe:      false,
	DelayedRedelivery: true,
	OrderPerKey:       false,
	RejectsUnroutable: true,
}

func TestBrokerConformance(t *testing.T) {
	url := brokerURL(t)
	postboxbrokertest.Run(t, postboxbrokertest.Harness{
		Features: features,
		New: func(t *testing.T) *postboxbrokertest.Broker {
			conn := admin(t, url)
			base := uniqueName()
			topic := "suite." + base
			queues := map[string]string{}
			ensure(t, conn, postboxamqp.Topology{Exchange: base})
			for _, c := range suiteConsumers {
				q := base + "." + c
				ensure(t, conn, postboxamqp.Topology{Exchange: base, Queue: q, Bindings: []string{topic}})
				queues[c] = q
			}
			pub := publisher(t, postboxamqp.URL(url), &postboxamqp.Config{Exchange: base})
			return &postboxbrokertest.Broker{
				Publisher:  pub,
				Topic:      topic,
				Unroutable: "nowhere." + base,
				Subscriber: func(t *testing.T, consumer string, o postboxbrokertest.SubscriberOptions) postbox.Subscriber {
					q, ok := queues[consumer]
					if !ok {
						t.Fatalf("the suite subscribes as %q; declare a queue for it in suiteConsumers", consumer)
					}
					sub, err := postboxamqp.NewSubscriber(postboxamqp.URL(url), q, &postboxamqp.SubscriberConfig{
						PerKey: o.PerKey, MaxInFlight: o.MaxInFlight, Logger: quiet,
						ReconnectBackoff: 10 * time.Millisecond, ReconnectBackoffMax: 100 * time.Millisecond,
					})
					if err != nil {
						t.Fatal(err)
					}
					return sub
				},
			}
		},
	})
}
