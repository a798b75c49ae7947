package postboxamqp

import (
	"context"
	"testing"

	"github.com/postbox-go/postbox"
)

// hinted asks for an in-flight window of its own.
type hinted int

func (hinted) Process(context.Context, *postbox.Delivery) postbox.Verdict {
	return postbox.Verdict{Action: postbox.Ack}
}

func (h hinted) InFlightHint() int { return int(h) }

// plain asks for nothing.
type plain struct{}

func (plain) Process(context.Context, *postbox.Delivery) postbox.Verdict {
	return postbox.Verdict{Action: postbox.Ack}
}

func TestWindowTakesTheHint(t *testing.T) {
	for _, c := range []struct {
		name                 string
		cfg                  *SubscriberConfig
		p                    postbox.Processor
		wantIn, wantPrefetch int
	}{
		{"defaults, no hint", nil, plain{}, DefaultMaxInFlight, DefaultPrefetch},
		{"defaults, hint below", nil, hinted(8), DefaultMaxInFlight, DefaultPrefetch},
		{"defaults, hint above both", nil, hinted(128), 128, 128 + DefaultPrefetch - DefaultMaxInFlight},
		{"prefetch set bounds the hint", &SubscriberConfig{Prefetch: 100}, hinted(128), 100, 100},
		{"prefetch set above the hint", &SubscriberConfig{Prefetch: 500}, hinted(128), 128, 500},
		{"MaxInFlight set is kept", &SubscriberConfig{MaxInFlight: 4}, hinted(128), 4, DefaultPrefetch},
		{"hint over the ceiling", nil, hinted(1 << 20), maxPrefetch, maxPrefetch},
		{"prefetch set below the default window", &SubscriberConfig{Prefetch: 4}, plain{}, 4, 4},
		{"prefetch set below the default window, hint", &SubscriberConfig{Prefetch: 4}, hinted(128), 4, 4},
	} {
		s, err := NewSubscriber(URL("amqp://127.0.0.1:5672/"), "q", c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		in, prefetch := s.window(c.p)
		if in != c.wantIn || prefetch != c.wantPrefetch {
			t.Errorf("%s: window = %d, prefetch %d; want %d, %d", c.name, in, prefetch, c.wantIn, c.wantPrefetch)
		}
	}
}
