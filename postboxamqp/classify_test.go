package postboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxamqp"
)

func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("publish x: %w", err) }
	for _, tc := range []struct {
		err  error
		want postboxamqp.Class
	}{
		{postbox.NewMessageError(errors.New("refused")), postboxamqp.Message},
		{wrap(postboxamqp.ErrUnroutable), postboxamqp.Message},
		{wrap(postboxamqp.ErrTooLarge), postboxamqp.Message},
		{wrap(postboxamqp.ErrInvalidRoutingKey), postboxamqp.Message},
		{wrap(postboxamqp.ErrInvalidHeader), postboxamqp.Message},
		{wrap(postboxamqp.ErrNoID), postboxamqp.Message},
		{fmt.Errorf("%w: %w", postboxamqp.ErrRejected, &amqp.Error{Code: amqp.PreconditionFailed, Server: true}), postboxamqp.Message},
		{wrap(postboxamqp.ErrNacked), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrNoExchange), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrConnectionLost), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrNotConnected), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrPublishTimeout), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrBlocked), postboxamqp.Infrastructure},
		{wrap(postboxamqp.ErrClosed), postboxamqp.Infrastructure},
		{context.Canceled, postboxamqp.Infrastructure},
		{context.DeadlineExceeded, postboxamqp.Infrastructure},
		{&amqp.Error{Code: amqp.ConnectionForced, Server: true}, postboxamqp.Infrastructure},
		{amqp.ErrClosed, postboxamqp.Infrastructure},
		{errors.New("something unknown"), postboxamqp.Infrastructure},
	} {
		if got := postboxamqp.Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

func TestDeliveryMapping(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := postboxamqp.DeliveryOf(&amqp.Delivery{
		MessageId: "", ContentType: "application/json", RoutingKey: "rk", Redelivered: true,
		Headers: amqp.Table{
			"cloudEvents_id": "id-1", "cloudEvents:type": "orders.paid", "cloudEvents:partitionkey": "k",
			"x-delivery-count": int64(2), "x-death": []any{amqp.Table{"count": int64(1)}},
			"n": int32(7), "ok": true, "at": ts, "raw": []byte("b"),
		},
		Body: []byte("p"),
	})
	want := map[string]string{
		"ce-id": "id-1", "ce-type": "orders.paid", "ce-partitionkey": "k", "content-type": "application/json",
		"n": "7", "ok": "true", "at": "2026-01-02T03:04:05Z", "raw": "b",
	}
	if d.ID != "id-1" || d.Topic != "orders.paid" || d.Key != "k" || d.Delivered != 3 || fmt.Sprint(d.Headers) != fmt.Sprint(want) {
		t.Fatalf("delivery %+v", d)
	}
	// A classic queue's redelivery carries no count; a message from
	// elsewhere has no ce-type.
	d = postboxamqp.DeliveryOf(&amqp.Delivery{MessageId: "m", Type: "", RoutingKey: "rk", Redelivered: true})
	if d.ID != "m" || d.Topic != "rk" || d.Delivered != 0 {
		t.Fatalf("delivery %+v", d)
	}
	d = postboxamqp.DeliveryOf(&amqp.Delivery{MessageId: "m", Type: "typed", RoutingKey: "rk"})
	if d.Topic != "typed" || d.Delivered != 1 {
		t.Fatalf("delivery %+v", d)
	}
}
