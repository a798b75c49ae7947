package postboxnats_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxbrokertest"
	"github.com/postbox-go/postbox/postboxnats"
)

// TestBrokerConformance runs the broker suite for the JetStream Publisher
// and Subscriber, against the embedded server and the machine's.
//
// Each test gets a stream of its own that captures "<name>.suite.>":
// the suite's topic "suite.events" lands in it, and "nowhere" maps to
// "<name>.nowhere", which no stream captures. A subscriber's consumer
// name is the suite's, made with EnsureConsumer (twice for competing
// subscribers of one consumer, which is idempotent).
func TestBrokerConformance(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		postboxbrokertest.Run(t, postboxbrokertest.Harness{
			New: func(t *testing.T) *postboxbrokertest.Broker {
				_, js := connect(t, url)
				_, base := stream(t, js, func(c *jetstream.StreamConfig) { c.Subjects = []string{c.Name + ".suite.>"} })
				prefix := base + "."
				return &postboxbrokertest.Broker{
					Publisher: publisher(t, js, &postboxnats.Config{SubjectPrefix: prefix}),
					Topic:     "suite.events",
					Subscriber: func(t *testing.T, consumer string, o postboxbrokertest.SubscriberOptions) postbox.Subscriber {
						c := ensureConsumer(t, js, base, consumer, nil)
						return subscriber(t, c, &postboxnats.SubscriberConfig{SubjectPrefix: prefix, PerKey: o.PerKey, MaxInFlight: o.MaxInFlight})
					},
					Unroutable: "nowhere",
				}
			},
			Features: postboxbrokertest.Features{
				// Nats-Msg-Id within the stream's Duplicates window.
				NativeDedupe: true,
				// Retry is a nak with the verdict's delay.
				DelayedRedelivery: true,
				// Within one Run; see the package documentation.
				OrderPerKey: true,
				// The Publisher confirms "no stream" with a lookup.
				RejectsUnroutable: true,
			},
		})
	})
}
