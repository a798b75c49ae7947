package postboxnats

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox/internal/keyorder"
)

// floorConsumer answers Info with an ack floor and MaxDeliver, or err.
type floorConsumer struct {
	jetstream.Consumer
	floor      uint64
	maxDeliver int
	err        error
}

func (c *floorConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &jetstream.ConsumerInfo{
		Config:   jetstream.ConsumerConfig{MaxDeliver: c.maxDeliver},
		AckFloor: jetstream.SequenceInfo{Stream: c.floor},
	}, nil
}

// TestOverdueMarkerLookedUp: a marker whose redelivery is overdue is given
// up only when the consumer's ack floor has passed it, or under MaxDeliver;
// one the server still holds pending waits another whole wait, holding its
// key; when the consumer cannot be read, every marker waits on.
func TestOverdueMarkerLookedUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cons     *floorConsumer
		givenUp  bool
		extended bool
	}{
		{"still pending", &floorConsumer{floor: 4}, false, true},
		{"acknowledged elsewhere or deleted", &floorConsumer{floor: 5}, true, false},
		{"under MaxDeliver", &floorConsumer{floor: 4, maxDeliver: 5}, true, false},
		{"consumer unreadable", &floorConsumer{err: errors.New("no responders")}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Subscriber{cons: tc.cons, log: slog.New(slog.NewTextHandler(io.Discard, nil)), name: "s > c"}
			r := &run{s: s, ctx: context.Background()}
			k := newKeyOrder(r, 8, time.Second, time.Second)
			now := time.Now()
			m := &entry{}
			k.keys.Add("k", keyorder.Pos{Hi: 5}, m)
			k.toMarker(m, now, time.Second)
			behind := &entry{}
			k.keys.Add("k", keyorder.Pos{Hi: 6}, behind)

			late := m.Due().Add(k.giveUp).Add(time.Millisecond)
			overdue := k.keys.Overdue(late)
			if len(overdue) != 1 {
				t.Fatalf("%d overdue markers, want 1", len(overdue))
			}
			k.overdue(late, overdue)
			if got := !k.keys.IsMarker(m); got != tc.givenUp {
				t.Fatalf("given up: %v, want %v", got, tc.givenUp)
			}
			if tc.extended && len(k.keys.Overdue(late.Add(time.Second))) != 0 {
				t.Fatal("a marker kept was not given another wait")
			}
			if _, ok := k.keys.Next("k"); ok != tc.givenUp {
				t.Fatalf("the key's next message may start: %v, want %v", ok, tc.givenUp)
			}
		})
	}
}
