package postboxkafka_test

import (
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxbrokertest"
	"github.com/postbox-go/postbox/postboxkafka"
)

// features declares what Kafka offers the suite:
//
//   - NativeDedupe: no. The idempotent producer drops the client's own
//     retries of one produce request; a message published again (a relay
//     that lost the acknowledgement sends it anew) is a new record, and
//     the consumers' inbox absorbs the copy.
//   - DelayedRedelivery: yes. The Subscriber holds the partition for the
//     Retry's delay, then processes the same record again.
//   - OrderPerKey: yes. A key's messages are in one partition, in order;
//     a partition is processed one record at a time, and a rebalance hands
//     it on only after its settled offsets are committed (package doc).
//   - RejectsUnroutable: yes. A topic the cluster confirms missing fails
//     as a message failure (ErrNoTopic).
var features = postboxbrokertest.Features{
	NativeDedupe:      false,
	DelayedRedelivery: true,
	OrderPerKey:       true,
	RejectsUnroutable: true,
	PartitionBound:    true,
}

func TestBrokerConformance(t *testing.T) {
	postboxbrokertest.Run(t, postboxbrokertest.Harness{
		Features: features,
		New: func(t *testing.T) *postboxbrokertest.Broker {
			c := cluster(t)
			topic := uniqueName("suite")
			ensure(t, client(t, c), topic, 4, nil)
			return &postboxbrokertest.Broker{
				Publisher:  publisher(t, client(t, c), nil),
				Topic:      topic,
				Unroutable: uniqueName("nowhere"),
				Subscriber: func(t *testing.T, consumer string, o postboxbrokertest.SubscriberOptions) postbox.Subscriber {
					// Every partition is processed one record at a time, so
					// PerKey has nothing to add.
					return subscriber(t, c, topic+"."+consumer, []string{topic}, &postboxkafka.SubscriberConfig{MaxInFlight: o.MaxInFlight})
				},
			}
		},
	})
}
