package postboxotel_test

import (
	"context"
	"testing"

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

// The writer's trace context is stored with the message, the relay's
// publish span links to it, the broker carries it, and the consumer's span
// continues it.
func TestTraceFlow(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(ctx) }()
	tr := postboxotel.New(tp, propagation.TraceContext{})

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
