package postboxamqp

import (
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// BenchmarkPublishing is the Publisher's mapping of the relay's envelope
// of a typical row (the CloudEvents attributes, the replay horizon and a
// content-type) to the AMQP message it sends.
//
//	go test -run '^$' -bench Publishing -benchmem -count 5 ./postboxamqp/
func BenchmarkPublishing(b *testing.B) {
	p, err := New(URL("amqp://127.0.0.1:5672/"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Close(context.Background()) }()
	id := "01943b6e-7c1a-7d2e-9f3a-0123456789ab"
	env := &postbox.Envelope{
		ID: id, Topic: "orders.created", Key: "order-42", Payload: []byte(`{"order":42,"total":"99.90","currency":"EUR"}`),
		CreatedAt: time.Date(2026, 12, 3, 23, 29, 43, 123456000, time.UTC), Attempt: 1,
		Headers: map[string]string{
			postbox.HeaderSpecVersion: "1.0", postbox.HeaderID: id, postbox.HeaderType: "orders.created",
			postbox.HeaderSource: "/orders", postbox.HeaderTime: "2026-12-03T23:29:43.123456Z",
			postbox.HeaderPartitionKey: "order-42", postbox.HeaderReplayHorizon: "604800",
			postbox.HeaderContentType: "application/json",
		},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := p.publishing(env); err != nil {
			b.Fatal(err)
		}
	}
}
