package postboxamqp

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
)

// TestBlockedIsInfrastructure: while the broker blocks publishing on the
// connection (a memory or disk alarm), a publish fails with ErrBlocked,
// an infrastructure failure, without being sent.
func TestBlockedIsInfrastructure(t *testing.T) {
	s := &session{gate: make(chan struct{}, 1), blocked: "low on memory", pending: map[uint64]*flight{}}
	err := s.publish(context.Background(), &flight{id: "m1"}, amqp.Publishing{})
	if !errors.Is(err, ErrBlocked) || postbox.IsMessageError(err) {
		t.Fatalf("got %v, want an infrastructure failure wrapping ErrBlocked", err)
	}
	if len(s.pending) != 0 {
		t.Fatal("a blocked publish was registered")
	}
}
