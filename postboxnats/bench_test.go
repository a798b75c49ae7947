package postboxnats_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxnats"
)

// The benchmarks measure publishes of 256-byte payloads with 256
// unacknowledged at most, against the machine's NATS server (file
// storage), so the adapter's cost shows against the broker's own rate:
//
//	go test -run '^$' -bench 'RawAsyncPublish|Publisher' -benchtime=100000x -count=3 ./postboxnats/
const (
	benchPayload = 256
	benchWindow  = 256
)

func benchTarget(b *testing.B) (jetstream.JetStream, string, func(...nats.Option) jetstream.JetStream) {
	b.Helper()
	url := realNATSURL()
	if err := reachable(url); err != nil {
		b.Skipf("the machine's NATS server at %s is unreachable (%v)", url, err)
	}
	dial := func(opts ...nats.Option) jetstream.JetStream {
		nc, err := nats.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		return js
	}
	js := dial()
	_, base := stream(b, js, nil)
	return js, base, dial
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = postbox.NewID()
	}
	return out
}

// BenchmarkRawAsyncPublish is the broker's rate through the client alone:
// PublishAsync with the client's own pending limit as the window.
func BenchmarkRawAsyncPublish(b *testing.B) {
	for _, withID := range []bool{false, true} {
		name := "plain"
		if withID {
			name = "msgid"
		}
		b.Run(name, func(b *testing.B) {
			_, base, _ := benchTarget(b)
			var failed atomic.Int64
			var firstErr atomic.Value
			nc, err := nats.Connect(realNATSURL())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc,
				jetstream.WithPublishAsyncMaxPending(benchWindow),
				jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}))
			if err != nil {
				b.Fatal(err)
			}
			var msgIDs []string
			if withID {
				msgIDs = ids(b.N)
			}
			payload := make([]byte, benchPayload)
			subject := base + ".bench"
			b.ReportAllocs()
			b.SetBytes(benchPayload)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				var opts []jetstream.PublishOpt
				if withID {
					opts = []jetstream.PublishOpt{jetstream.WithMsgID(msgIDs[i])}
				}
				for {
					_, err := js.PublishAsync(subject, payload, opts...)
					if err == nil {
						break
					}
					if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
						b.Fatal(err)
					}
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("acks not complete within a minute")
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d publishes failed, first: %v", n, firstErr.Load())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkPublisher is the same load through the Publisher, as the relay
// drives it: envelopes with their CloudEvents headers, done per message.
// "idonly" sends the id and nothing else, like RawAsyncPublish/msgid, so
// the two differ only by the adapter.
func BenchmarkPublisher(b *testing.B) {
	for _, headers := range []bool{false, true} {
		name := "idonly"
		if headers {
			name = "cloudevents"
		}
		b.Run(name, func(b *testing.B) {
			js, base, _ := benchTarget(b)
			p, err := postboxnats.New(js, &postboxnats.Config{SubjectPrefix: base + ".", MaxPending: benchWindow})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = p.Close(context.Background()) }()
			payload := make([]byte, benchPayload)
			envs := make([]postbox.Envelope, b.N)
			for i, id := range ids(b.N) {
				envs[i] = postbox.Envelope{ID: id, Topic: "bench", Payload: payload, Attempt: 1}
				if headers {
					envs[i].Headers = cloudEventsHeaders(id)
				}
			}
			var wg sync.WaitGroup
			var failed atomic.Int64
			var firstErr atomic.Value
			done := func(err error) {
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				wg.Done()
			}
			// A context that can end, as the relay's batch context can:
			// each publish then registers with it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			wg.Add(b.N)
			b.ReportAllocs()
			b.SetBytes(benchPayload)
			b.ResetTimer()
			start := time.Now()
			for i := range envs {
				p.Publish(ctx, &envs[i], done)
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if n := failed.Load(); n > 0 {
				b.Fatalf("%d publishes failed, first: %v", n, firstErr.Load())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}

// cloudEventsHeaders is the CloudEvents attributes of a benchmark
// envelope with id.
func cloudEventsHeaders(id string) map[string]string {
	return map[string]string{
		postbox.HeaderSpecVersion: "1.0",
		postbox.HeaderID:          id,
		postbox.HeaderType:        "bench",
		postbox.HeaderSource:      "postbox",
		postbox.HeaderTime:        "2026-01-02T03:04:05.123456Z",
		postbox.HeaderContentType: "application/octet-stream",
	}
}

// encodeTarget is a Publisher for benchmarks that send nothing: the
// machine's NATS server when it is reachable, else the embedded one.
func encodeTarget(b *testing.B, cfg *postboxnats.Config) *postboxnats.Publisher {
	b.Helper()
	url := realNATSURL()
	if reachable(url) != nil {
		url = sharedEmbedded(b)
	}
	_, js := connect(b, url)
	return publisher(b, js, cfg)
}

// benchRow is a stored headers column of the "typical" shape the root
// package's benchmarks make with encodeHeaders: CloudEvents attributes,
// three headers of the message's own and the writer's trace context.
const benchRow = `{"ce-source":"/shop/orders","ce-subject":"order-42","ce-time":"2026-01-02T03:04:05.123456Z",` +
	`"content-type":"application/json","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",` +
	`"tracestate":"vendor=opaque","x-correlation-id":"c0ffee00-1234-4abc-8def-0123456789ab","x-schema":"orders.v3","x-tenant":"acme"}`

// benchEnvelope is the envelope the relay makes of benchRow: the stored
// headers with the attributes derived from the row.
func benchEnvelope(b *testing.B) *postbox.Envelope {
	b.Helper()
	h, err := postbox.DecodeHeaders([]byte(benchRow))
	if err != nil {
		b.Fatal(err)
	}
	addRowAttributes(h, "01943b6e-7c1a-7d2e-9f3a-0123456789ab", "orders.created", "order-42")
	return &postbox.Envelope{
		ID: "01943b6e-7c1a-7d2e-9f3a-0123456789ab", Topic: "orders.created", Key: "order-42",
		Payload: []byte(`{"order":42,"total":"99.90","currency":"EUR"}`), Headers: h, Attempt: 1,
	}
}

// addRowAttributes adds what the relay derives from a row to its decoded
// headers, as it does for the rows of benchRow's shape.
func addRowAttributes(h map[string]string, id, topic, key string) {
	h[postbox.HeaderSpecVersion] = "1.0"
	h[postbox.HeaderReplayHorizon] = "604800"
	h[postbox.HeaderID] = id
	h[postbox.HeaderType] = topic
	h[postbox.HeaderPartitionKey] = key
}

// BenchmarkEncodeMsg is the Publisher's encoding of an envelope into the
// NATS message it sends: subject, headers, Nats-Msg-Id. "idonly" and
// "cloudevents" are BenchmarkPublisher's envelopes, "typical" the relay's
// envelope of a typical row.
//
//	go test -run '^$' -bench 'EncodeMsg|RowToMsg' -benchmem -count 5 ./postboxnats/
func BenchmarkEncodeMsg(b *testing.B) {
	id := "01943b6e-7c1a-7d2e-9f3a-0123456789ab"
	cases := []struct {
		name string
		env  *postbox.Envelope
	}{
		{"idonly", &postbox.Envelope{ID: id, Topic: "bench", Payload: make([]byte, benchPayload), Attempt: 1}},
		{"cloudevents", &postbox.Envelope{ID: id, Topic: "bench", Payload: make([]byte, benchPayload), Attempt: 1, Headers: cloudEventsHeaders(id)}},
		{"typical", benchEnvelope(b)},
	}
	p := encodeTarget(b, &postboxnats.Config{SubjectPrefix: "bench.", MaxPending: benchWindow})
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := postboxnats.EncodeMsg(p, c.env); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRowToMsg is the whole path of a typical row from its stored
// headers to the NATS message: decode, add the row's attributes, encode.
func BenchmarkRowToMsg(b *testing.B) {
	p := encodeTarget(b, &postboxnats.Config{SubjectPrefix: "bench.", MaxPending: benchWindow})
	row := []byte(benchRow)
	payload := []byte(`{"order":42,"total":"99.90","currency":"EUR"}`)
	id := "01943b6e-7c1a-7d2e-9f3a-0123456789ab"
	b.ReportAllocs()
	for b.Loop() {
		h, err := postbox.DecodeHeaders(row)
		if err != nil {
			b.Fatal(err)
		}
		addRowAttributes(h, id, "orders.created", "order-42")
		env := &postbox.Envelope{ID: id, Topic: "orders.created", Key: "order-42", Payload: payload, Headers: h, Attempt: 1}
		if _, err := postboxnats.EncodeMsg(p, env); err != nil {
			b.Fatal(err)
		}
	}
}
