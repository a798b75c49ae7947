package postbox

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Micro-benchmarks of the relay's per-message work between reading a row
// and handing its envelope to a publisher:
//
//	go test -run '^$' -bench 'DecodeHeaders|RelayEnvelope' -benchmem -count 5 .

// benchRows are stored rows as a writer makes them (encodeHeaders), by
// shape: "minimal" is a message with a topic and a payload only,
// "typical" one with its CloudEvents attributes, a few headers of its own
// and the writer's trace context.
func benchRows(tb testing.TB) []struct {
	name string
	rec  postboxdriver.Record
} {
	tb.Helper()
	created := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	typical := &Message{
		ID:      "01943b6e-7c1a-7d2e-9f3a-0123456789ab",
		Topic:   "orders.created",
		Key:     "order-42",
		Payload: []byte(`{"order":42,"total":"99.90","currency":"EUR"}`),
		Headers: map[string]string{
			"x-tenant":         "acme",
			"x-correlation-id": "c0ffee00-1234-4abc-8def-0123456789ab",
			"x-schema":         "orders.v3",
		},
		Source:      "/shop/orders",
		Subject:     "order-42",
		Time:        created,
		ContentType: "application/json",
	}
	trace := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "vendor=opaque",
	}
	minimal := &Message{ID: "01943b6e-7c1a-7d2e-9f3a-0123456789ac", Topic: "orders.created", Payload: []byte(`{}`)}
	rows := []struct {
		name string
		m    *Message
		tr   map[string]string
	}{{"minimal", minimal, nil}, {"typical", typical, trace}}
	out := make([]struct {
		name string
		rec  postboxdriver.Record
	}, len(rows))
	for i, r := range rows {
		b, err := encodeHeaders(r.m, DefaultSource, created, r.tr)
		if err != nil {
			tb.Fatal(err)
		}
		out[i].name = r.name
		out[i].rec = postboxdriver.Record{
			Seq: 1, ID: r.m.ID, Topic: r.m.Topic, Key: r.m.Key, Payload: r.m.Payload,
			Headers: b, Attempts: 0, CreatedAt: created,
		}
	}
	return out
}

// BenchmarkDecodeHeaders is the decoding of a stored headers column.
func BenchmarkDecodeHeaders(b *testing.B) {
	for _, row := range benchRows(b) {
		b.Run(row.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(row.rec.Headers)))
			for b.Loop() {
				if _, err := DecodeHeaders(row.rec.Headers); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRelayEnvelope is the relay's whole step from a row to the
// envelope it hands its publisher: decode the headers, add the
// attributes derived from the row.
func BenchmarkRelayEnvelope(b *testing.B) {
	r := &relay{cfg: &Config{Source: DefaultSource}, horizon: replayHorizon(DefaultRetention)}
	for _, row := range benchRows(b) {
		b.Run(row.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.envelope(&row.rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
