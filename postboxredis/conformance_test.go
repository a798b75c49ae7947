package postboxredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxbrokertest"
	"github.com/postbox-go/postbox/postboxredis"
)

// TestBrokerConformance runs the broker suite for the Publisher and the
// Subscriber against the machine's Redis.
//
// Each test gets a stream prefix of its own: the suite's topic
// "suite.events" maps to the stream "<prefix>suite.events", made up front
// (publishing creates no stream), and "nowhere" to "<prefix>nowhere",
// which does not exist. A subscriber's group is the suite's consumer
// name, made with EnsureGroup at the start of the stream (twice for the
// competing subscribers of one group, which is idempotent); each Run is
// a consumer of its own in it.
func TestBrokerConformance(t *testing.T) {
	c := client(t, nil)
	postboxbrokertest.Run(t, postboxbrokertest.Harness{
		New: func(t *testing.T) *postboxbrokertest.Broker {
			prefix := uniqueName() + ":"
			const topic = "suite.events"
			name := prefix + topic
			cleanup(t, name)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// A group that never reads, only to make the stream.
			if err := postboxredis.EnsureGroup(ctx, c, name, "setup", postboxredis.StartAtEnd); err != nil {
				t.Fatal(err)
			}
			return &postboxbrokertest.Broker{
				Publisher: publisher(t, c, &postboxredis.Config{StreamPrefix: prefix}),
				Topic:     topic,
				Subscriber: func(t *testing.T, consumer string, o postboxbrokertest.SubscriberOptions) postbox.Subscriber {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if err := postboxredis.EnsureGroup(ctx, c, name, consumer, postboxredis.StartAtBeginning); err != nil {
						t.Fatal(err)
					}
					return subscriber(t, c, postboxredis.SubscriberConfig{
						Stream: name, Group: consumer, PerKey: o.PerKey, MaxInFlight: o.MaxInFlight,
						Block: 200 * time.Millisecond,
					})
				},
				Unroutable: "nowhere",
			}
		},
		Features: postboxbrokertest.Features{
			// The Publisher's guard: a key per message id, checked and set
			// by the script that adds the entry, for DedupeWindow.
			NativeDedupe: true,
			// The Run holds a retried entry for the verdict's delay and
			// delivers it again itself.
			DelayedRedelivery: true,
			// Within one Run; see the package documentation.
			OrderPerKey: true,
			// A topic whose stream does not exist fails with ErrNoStream.
			RejectsUnroutable: true,
		},
	})
}
