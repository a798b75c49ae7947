package postboxtest_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxbrokertest"
	"github.com/postbox-go/postbox/postboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBrokerConformance(t *testing.T) {
	postboxbrokertest.Run(t, postboxbrokertest.Harness{
		New: func(t *testing.T) *postboxbrokertest.Broker {
			b := postboxtest.NewBroker(nil)
			b.Reject(func(env *postbox.Envelope) error {
				if env.Topic == "nowhere" {
					return errors.New("no route for topic nowhere")
				}
				return nil
			})
			return &postboxbrokertest.Broker{
				Publisher: b,
				Topic:     "suite.events",
				Subscriber: func(_ *testing.T, consumer string, o postboxbrokertest.SubscriberOptions) postbox.Subscriber {
					return b.Subscriber(consumer, &postboxtest.SubscriberOptions{PerKey: o.PerKey, MaxInFlight: o.MaxInFlight})
				},
				Unroutable: "nowhere",
			}
		},
		Features: postboxbrokertest.Features{NativeDedupe: true, DelayedRedelivery: true, OrderPerKey: true, RejectsUnroutable: true},
	})
}
