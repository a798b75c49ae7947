package postboxotel_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxotel"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// traced returns a driver on migrated tables under prefix and a Tracer
// whose spans rec records; the provider is shut down with the test.
func traced(t *testing.T) (*postboxpgx.Driver, string, *tracetest.SpanRecorder, *sdktrace.TracerProvider, *postboxotel.Tracer) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return postboxpgx.New(pool), prefix, rec, tp, postboxotel.New(tp, propagation.TraceContext{})
}

// The writer's trace context is stored with the message, the relay's
// publish span links to it, the broker carries it, and the consumer's span
// continues it.
func TestTraceFlow(t *testing.T) {
	ctx := context.Background()
	d, prefix, rec, tp, tr := traced(t)

	broker := postboxtest.NewBroker(nil)
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: broker, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	wctx, writeSpan := tp.Tracer("app").Start(ctx, "POST /orders")
	if err := client.Write(wctx, postbox.Message{Topic: "orders.created", Key: "o1"}); err != nil {
		t.Fatal(err)
	}
	writeSpan.End()
	if _, err := client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	env := broker.Messages()[0]
	if env.Headers["traceparent"] == "" {
		t.Fatalf("no traceparent on the broker's message: %v", env.Headers)
	}

	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	var handlerSpan trace.SpanContext
	v := inbox.Handle(ctx, "ledger", &postbox.Delivery{ID: env.ID, Topic: env.Topic, Key: env.Key, Headers: env.Headers},
		func(ctx context.Context, _ pgx.Tx, _ *postbox.Delivery) error {
			handlerSpan = trace.SpanContextFromContext(ctx)
			return nil
		})
	if v.Action != postbox.Ack {
		t.Fatal(v)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	w, pub, proc := spans["POST /orders"], spans["postbox publish orders.created"], spans["postbox process orders.created"]
	if w == nil || pub == nil || proc == nil {
		t.Fatalf("spans: %v", spans)
	}
	if len(pub.Links()) != 1 || pub.Links()[0].SpanContext.SpanID() != w.SpanContext().SpanID() {
		t.Fatalf("publish span links %v, want the writer's span", pub.Links())
	}
	if pub.SpanContext().TraceID() == w.SpanContext().TraceID() {
		t.Fatal("the relay's publish joined the writer's trace; it should only link to it")
	}
	if proc.Parent().SpanID() != w.SpanContext().SpanID() || proc.SpanContext().TraceID() != w.SpanContext().TraceID() {
		t.Fatalf("consumer span parent %v, want the writer's span %v", proc.Parent().SpanID(), w.SpanContext().SpanID())
	}
	if handlerSpan.SpanID() != proc.SpanContext().SpanID() {
		t.Fatal("the handler does not run in the consumer span")
	}
}

// A batch of deliveries gets a span of its own, in a trace of its own,
// linked to each delivery's span; a BatchHandler runs in it, and each
// delivery's span still continues its writer's trace.
func TestBatchSpan(t *testing.T) {
	ctx := context.Background()
	d, prefix, rec, tp, tr := traced(t)
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	var ds []*postbox.Delivery
	writers := map[string]trace.SpanContext{} // by message id
	for i := range n {
		wctx, span := tp.Tracer("app").Start(ctx, "POST /orders")
		id := postbox.NewID()
		headers := map[string]string{}
		tr.Inject(wctx, headers)
		span.End()
		writers[id] = span.SpanContext()
		ds = append(ds, &postbox.Delivery{ID: id, Topic: "orders.created", Key: string(rune('a' + i)), Headers: headers})
	}

	var mu sync.Mutex
	calls := map[trace.SpanID][]string{} // the span each call of more than one delivery ran in, and its ids
	p, err := client.Inbox().BatchHandlerProcessor("ledger", func(ctx context.Context, _ pgx.Tx, ds []*postbox.Delivery) error {
		if len(ds) > 1 {
			mu.Lock()
			defer mu.Unlock()
			span := trace.SpanContextFromContext(ctx).SpanID()
			for _, d := range ds {
				calls[span] = append(calls[span], d.ID)
			}
		}
		return nil
	}, &postbox.BatchConfig{MaxBatch: n, MaxWait: time.Second, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() {
			if v := p.Process(ctx, d); v.Action != postbox.Ack {
				t.Errorf("delivery %s: %+v", d.ID, v)
			}
		})
	}
	wg.Wait()

	processed := map[trace.SpanID]string{} // each delivery's span, to its id
	batches := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "postbox process orders.created":
			for _, a := range s.Attributes() {
				if a.Key == "messaging.message.id" {
					id := a.Value.AsString()
					processed[s.SpanContext().SpanID()] = id
					if w := writers[id]; s.Parent().SpanID() != w.SpanID() || s.SpanContext().TraceID() != w.TraceID() {
						t.Errorf("delivery %s: span's parent %v, want its writer's %v", id, s.Parent().SpanID(), w.SpanID())
					}
				}
			}
		case "postbox process batch":
			batches[s.SpanContext().SpanID()] = s
		}
	}
	if len(processed) != n {
		t.Fatalf("%d deliveries' spans, want %d", len(processed), n)
	}
	if len(calls) == 0 {
		t.Fatal("no call applied more than one delivery")
	}
	for spanID, ids := range calls {
		b := batches[spanID]
		if b == nil {
			t.Fatalf("a batch handler ran in span %v, not a batch's (%d batch spans)", spanID, len(batches))
		}
		var linked []string
		for _, l := range b.Links() {
			linked = append(linked, processed[l.SpanContext.SpanID()])
		}
		slices.Sort(linked)
		slices.Sort(ids)
		if !slices.Equal(linked, ids) {
			t.Errorf("batch span links the deliveries %v, want %v", linked, ids)
		}
		for _, w := range writers {
			if b.SpanContext().TraceID() == w.TraceID() || b.Parent().IsValid() {
				t.Fatal("the batch span joined a delivery's trace; it should only link to its deliveries")
			}
		}
		attrs := map[string]string{}
		for _, a := range b.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["messaging.batch.message_count"] != fmt.Sprint(len(ids)) || attrs["postbox.batch.outcome"] != "committed" ||
			attrs["messaging.consumer.group.name"] != "ledger" {
			t.Errorf("batch span attributes %v", attrs)
		}
	}
}
