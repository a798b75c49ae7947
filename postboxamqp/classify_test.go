package postboxamqp_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/postbox-go/postbox/postboxamqp"
)

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
	if d.ID != "m" || d.Topic != "rk" || d.Delivered != 0 || !d.Redelivered {
		t.Fatalf("delivery %+v", d)
	}
	d = postboxamqp.DeliveryOf(&amqp.Delivery{MessageId: "m", Type: "typed", RoutingKey: "rk"})
	if d.Topic != "typed" || d.Delivered != 1 {
		t.Fatalf("delivery %+v", d)
	}
}
